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

#if defined(__AVX2__) && defined(__FMA__)
// y_j = W x_j for the M rows x_j of a decode step's activations ([M, k] in, [M, n] out), in one pass
// over W: these products only stream W (x stays in L1), and each load of W serves all M rows. Each thread takes
// one contiguous block of W's rows and reads it row after row, so its weights are one sequential stream, with
// M x kGroups accumulators of 8 lanes in flight. It also prefetches 2 KB ahead in that stream, which carries the
// hardware prefetcher over page boundaries. On the development machines:
// - an AMD EPYC VM (2 cores, 2026-12-01, the model's GEMVs in a loop, M = 1): 27-30 GB/s when each thread read
//   four rows of W at a time with a prefetch eight rows ahead (the version before this one), 34 GB/s one row at
//   a time without a prefetch, 35-38 GB/s with it;
// - an Intel Emerald Rapids VM (2026-11-30): the four-row version, 14 to 16 GB/s (best of 40), against OpenBLAS's
//   sgemv at 12-13; this version has not run there.
// With `accumulate`, y_j += W x_j.
template <int M>
void stream_weights_block(const float* w, const float* x, float* y, int64_t n, int64_t k, bool accumulate) {
  constexpr int kGroups = M >= 4 ? 1 : 4 / M;  // 8-column groups per step: M * kGroups FMA chains
  constexpr int64_t kStep = 8 * kGroups;
  constexpr int64_t kPrefetchFloats = 512;  // 2 KB
  const int64_t k_main = k / kStep * kStep;
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t begin = n * thread / threads, end = n * (thread + 1) / threads;
    for (int64_t r = begin; r < end; ++r) {
      const float* row = w + r * k;
      const int64_t left_in_stream = (end - r) * k;  // floats from `row` to the end of this thread's rows
      // The loops over j and g unroll completely, so acc lives in registers (M * kGroups <= 8 of the 16).
      __m256 acc[M][kGroups];
#pragma GCC unroll 8
      for (int j = 0; j < M; ++j)
#pragma GCC unroll 4
        for (int g = 0; g < kGroups; ++g) acc[j][g] = _mm256_setzero_ps();
      for (int64_t i = 0; i < k_main; i += kStep) {
#pragma GCC unroll 2
        for (int64_t line = 0; line < kStep; line += 16) {  // one prefetch per 64-byte line
          const int64_t ahead = i + (kStep >= 16 ? line : 0) + kPrefetchFloats;
          if ((kStep >= 16 || (i & 15) == 0) && ahead + 16 < left_in_stream)
            _mm_prefetch(reinterpret_cast<const char*>(row + ahead), _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int g = 0; g < kGroups; ++g) {
          const __m256 wv = _mm256_loadu_ps(row + i + 8 * g);
#pragma GCC unroll 8
          for (int j = 0; j < M; ++j) acc[j][g] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * k + i + 8 * g), acc[j][g]);
        }
      }
#pragma GCC unroll 8
      for (int j = 0; j < M; ++j) {
        __m256 total = acc[j][0];
#pragma GCC unroll 4
        for (int g = 1; g < kGroups; ++g) total = _mm256_add_ps(total, acc[j][g]);
        const float* xj = x + j * k;
        const float sum = horizontal_sum(total) + dot(row + k_main, xj + k_main, static_cast<int32_t>(k - k_main));
        float& out = y[j * n + r];
        out = (accumulate ? out : 0.0f) + sum;
      }
    }
  }
}
#endif

// Decode batches up to this many rows stream W, once per 8 rows; larger ones go to OpenBLAS's sgemm. On the AMD
// EPYC VM (`bench decode --device cpu`, SmolLM2, 512-token contexts) streaming took 1.3-2.5x fewer milliseconds per
// step than sgemm at 2-8 rows, 1.6-1.9x at 12 and 1.1x at 16.
constexpr int64_t kMaxStreamedRows = 16;

// y = x W^T for the m <= kMaxStreamedRows rows of x: a pass over W for each 8 of them.
void stream_weights(const float* w, const float* x, float* y, int64_t m, int64_t n, int64_t k, bool accumulate) {
#if defined(__AVX2__) && defined(__FMA__)
  if (m > 8) {
    stream_weights_block<8>(w, x, y, n, k, accumulate);
    return stream_weights(w, x + 8 * k, y + 8 * n, m - 8, n, k, accumulate);
  }
  switch (m) {
    case 1: return stream_weights_block<1>(w, x, y, n, k, accumulate);
    case 2: return stream_weights_block<2>(w, x, y, n, k, accumulate);
    case 3: return stream_weights_block<3>(w, x, y, n, k, accumulate);
    case 4: return stream_weights_block<4>(w, x, y, n, k, accumulate);
    case 5: return stream_weights_block<5>(w, x, y, n, k, accumulate);
    case 6: return stream_weights_block<6>(w, x, y, n, k, accumulate);
    case 7: return stream_weights_block<7>(w, x, y, n, k, accumulate);
    default: return stream_weights_block<8>(w, x, y, n, k, accumulate);
  }
#else
  for (int64_t j = 0; j < m; ++j)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), static_cast<int>(k), 1.0f, w, static_cast<int>(k),
                x + j * k, 1, accumulate ? 1.0f : 0.0f, y + j * n, 1);
#endif
}

// out = x w^T (+ bias), or out += x w^T with `accumulate`.
void project(TensorView out, TensorView x, TensorView w, const TensorView* bias, bool accumulate) {
  const int64_t k = w.shape[1];
  const int64_t n = w.shape[0];
  const int64_t m = x.numel() / k;
  float* y = out.ptr<float>();
  if (m <= kMaxStreamedRows) {
    stream_weights(w.ptr<float>(), x.ptr<float>(), y, m, n, k, accumulate);
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
