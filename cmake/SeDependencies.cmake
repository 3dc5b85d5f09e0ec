# Third-party dependencies, all from Debian packages (see scripts/install-deps.sh).
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# OpenBLAS built on OpenMP, so BLAS calls and our OpenMP loops share one thread pool (the pthread build's
# pool and OpenMP's spinning workers oversubscribe the cores and slow decode several-fold).
find_library(SE_OPENBLAS_LIBRARY openblas PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
             NO_DEFAULT_PATH REQUIRED)
find_path(SE_OPENBLAS_INCLUDE cblas.h PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
          NO_DEFAULT_PATH REQUIRED)
add_library(se_openblas INTERFACE)
target_link_libraries(se_openblas INTERFACE ${SE_OPENBLAS_LIBRARY} OpenMP::OpenMP_CXX)
target_include_directories(se_openblas SYSTEM INTERFACE ${SE_OPENBLAS_INCLUDE})
if(SE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
