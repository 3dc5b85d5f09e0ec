#include <cblas.h>

#include <omp.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vector_math.h"

namespace se::cpu {

namespace {

// OpenBLAS picks its kernels for the CPU when it loads, and on a CPU newer than its tables falls back to its
// slowest, SSE3-only ones ("Prescott"): Debian 12's 0.3.21 does so on an Emerald Rapids Xeon, where prefill then
// ran 3.4x slower than with its AVX-512 kernels. OpenBLAS reads OPENBLAS_CORETYPE only while it loads, so when it
// fell back and the user did not choose, the process starts over once with the kernel family the CPU supports
// (AVX-512: SkylakeX; else Haswell, since the build requires AVX2). This runs as a constructor of the executable:
// after the libraries initialized (OpenBLAS has made its choice), before main. Setting OPENBLAS_CORETYPE keeps
// OpenBLAS's own choice; if the exec fails, the process goes on with it.
__attribute__((constructor)) void restart_if_openblas_fell_back(int /*argc*/, char** argv, char** /*envp*/) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::string_view(openblas_get_corename()) != "Prescott") return;
  // AT_BASE is 0 when the dynamic loader itself was run as the program (`ld.so ./sparse-engine ...`): then
  // /proc/self/exe names the loader, which this argv would not start the program with.
  if (getauxval(AT_BASE) == 0) return;
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return;
  path[length] = '\0';
  __builtin_cpu_init();  // constructors may run before the CPU-feature one
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  setenv("OPENBLAS_CORETYPE", avx512 ? "SkylakeX" : "Haswell", 0);
  execv(path, argv);  // the executable's real path, so the process keeps its name
  unsetenv("OPENBLAS_CORETYPE");
}

#if defined(__AVX2__) && defined(__FMA__)
// Sum of the 8 lanes.
inline float horizontal_sum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

// y = W x for a single row x: the decode step's matrix-vector products, which only stream W (x stays in L1).
// Each thread takes one contiguous block of rows and reads it row after row, so its weights are one sequential
// stream, four accumulators of 8 lanes keeping 32 columns of FMAs in flight. It also prefetches 2 KB ahead in that
// stream, which carries the hardware prefetcher over page boundaries. On the development machines:
// - an AMD EPYC VM (2 cores, 2026-12-01, the model's GEMVs in a loop): 27-30 GB/s when each thread read four
//   rows at a time with a prefetch eight rows ahead (the version before this one), 34 GB/s one row at a time
//   without a prefetch, 35-38 GB/s with it;
// - an Intel Emerald Rapids VM (2026-11-30): the four-row version, 14 to 16 GB/s (best of 40), against OpenBLAS's
//   sgemv at 12-13; this version has not run there.
// With `accumulate`, y += W x.
void gemv(const float* w, const float* x, float* y, int64_t n, int64_t k, bool accumulate) {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr int64_t kPrefetchFloats = 512;  // 2 KB
  const int64_t k32 = k / 32 * 32;
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t begin = n * thread / threads, end = n * (thread + 1) / threads;
    for (int64_t r = begin; r < end; ++r) {
      const float* row = w + r * k;
      const int64_t left_in_stream = (end - r) * k;  // floats from `row` to the end of this thread's rows
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      for (int64_t i = 0; i < k32; i += 32) {
        if (i + kPrefetchFloats + 16 < left_in_stream) {
          _mm_prefetch(reinterpret_cast<const char*>(row + i + kPrefetchFloats), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(row + i + kPrefetchFloats + 16), _MM_HINT_T0);
        }
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(row + i + 24), _mm256_loadu_ps(x + i + 24), a3);
      }
      float sum = horizontal_sum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      sum += dot(row + k32, x + k32, static_cast<int32_t>(k - k32));
      y[r] = (accumulate ? y[r] : 0.0f) + sum;
    }
  }
#else
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w, static_cast<int>(k), x,
              1, accumulate ? 1.0f : 0.0f, y, 1);
#endif
}

// out = x w^T (+ bias), or out += x w^T with `accumulate`.
void project(TensorView out, TensorView x, TensorView w, const TensorView* bias, bool accumulate) {
  const int64_t k = w.shape[1];
  const int64_t n = w.shape[0];
  const int64_t m = x.numel() / k;
  float* y = out.ptr<float>();
  if (m == 1) {
    gemv(w.ptr<float>(), x.ptr<float>(), y, n, k, accumulate);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, x.ptr<float>(), static_cast<int>(k), w.ptr<float>(),
                static_cast<int>(k), accumulate ? 1.0f : 0.0f, y, static_cast<int>(n));
  }
  if (bias != nullptr) {
    const float* b = bias->ptr<float>();
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) y[r * n + c] += b[c];
  }
}

}  // namespace

void linear(TensorView out, TensorView x, TensorView w, const TensorView* bias) {
  project(out, x, w, bias, false);
}

void linear_add(TensorView out, TensorView x, TensorView w) { project(out, x, w, nullptr, true); }

}  // namespace se::cpu
