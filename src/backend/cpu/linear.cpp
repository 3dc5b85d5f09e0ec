#include <cblas.h>

#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
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

// y = W x for a single row x: the decode step's matrix-vector products, which only stream W. Rows go four at a
// time so each load of x (in L1) serves four rows, and the threads split the rows. OpenBLAS's sgemv read W at
// 12.3-13.0 GB/s on the development machine, a fifth below what the decode floor allows.
//
// Each pass also prefetches the rows two blocks ahead, a cache line of each per line it reads: a row is a few KB,
// so the hardware prefetcher, which stops at page boundaries, starts every block late. On the development
// machine this took the model's GEMVs from 14.1 to 16.1 GB/s (best of 40) and 12.8 to 13.9 (median).
// With `accumulate`, y += W x.
void gemv(const float* w, const float* x, float* y, int64_t n, int64_t k, bool accumulate) {
#if defined(__AVX2__) && defined(__FMA__)
  constexpr int64_t kPrefetchRows = 8;
  constexpr int64_t kFloatsPerLine = 16;
  const int64_t k8 = k / 8 * 8;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; r += 4) {
    if (n - r < 4) {
      for (int64_t i = r; i < n; ++i) y[i] = (accumulate ? y[i] : 0.0f) + dot(w + i * k, x, static_cast<int32_t>(k));
      continue;
    }
    const float* w0 = w + r * k;
    const float* w1 = w0 + k;
    const float* w2 = w1 + k;
    const float* w3 = w2 + k;
    const float* ahead = w + std::min(r + kPrefetchRows, n - 4) * k;  // the last block prefetches itself
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t i = 0; i < k8; i += 8) {
      if (i % kFloatsPerLine == 0)
        for (int64_t row = 0; row < 4; ++row)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + row * k + i), _MM_HINT_T0);
      const __m256 xv = _mm256_loadu_ps(x + i);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), xv, a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), xv, a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), xv, a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), xv, a3);
    }
    float s0 = horizontal_sum(a0), s1 = horizontal_sum(a1), s2 = horizontal_sum(a2), s3 = horizontal_sum(a3);
    for (int64_t i = k8; i < k; ++i) {
      s0 += w0[i] * x[i];
      s1 += w1[i] * x[i];
      s2 += w2[i] * x[i];
      s3 += w3[i] * x[i];
    }
    y[r] = (accumulate ? y[r] : 0.0f) + s0;
    y[r + 1] = (accumulate ? y[r + 1] : 0.0f) + s1;
    y[r + 2] = (accumulate ? y[r + 2] : 0.0f) + s2;
    y[r + 3] = (accumulate ? y[r + 3] : 0.0f) + s3;
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
