# se_library(NAME SOURCES ... DEPS ...): one library per src/ folder. DEPS lists only folders that stand
# before this one in the module order (base -> tensor -> backend -> loader -> tokenizer -> chat -> model ...),
# so the link graph enforces the layering.
function(se_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# se_test(NAME SOURCES ... DEPS ... LABELS ...): a GoogleTest binary registered with CTest.
function(se_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE SE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "SE_SOURCE_DIR=${PROJECT_SOURCE_DIR};SE_BUILD_DIR=${PROJECT_BINARY_DIR}")
endfunction()

# se_pytest(NAME FILE LABELS ...): a Python test run with the repo's virtual environment.
function(se_pytest name file)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 900)
  endif()
  add_test(NAME ${name}
    COMMAND ${PROJECT_SOURCE_DIR}/.venv/bin/python -m pytest -q -x ${PROJECT_SOURCE_DIR}/${file})
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "SE_SOURCE_DIR=${PROJECT_SOURCE_DIR};SE_BUILD_DIR=${PROJECT_BINARY_DIR}")
endfunction()
