// The inner loops of the CPU attention ops, written so they vectorize: the dot product is an `omp simd`
// reduction (the compiler may reorder its sum), and the exponentials of a softmax row use a polynomial on AVX2
// instead of one libm call per element, which otherwise costs as much as the matrix products around it.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace se::cpu {

inline float dot(const float* a, const float* b, int32_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int32_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y += alpha * x.
inline void axpy(float alpha, const float* x, float* y, int32_t n) {
#pragma omp simd
  for (int32_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

#if defined(__AVX2__) && defined(__FMA__)
// e^x for x <= 0 (a softmax numerator): x = k ln2 + r with |r| <= ln2/2, e^r from a degree-6 polynomial, 2^k by
// building the exponent bits. Relative error about 2e-7; inputs below -87 flush to 0.
inline __m256 exp_nonpositive(__m256 x) {
  const __m256 min_x = _mm256_set1_ps(-87.0f);
  const __m256 flush = _mm256_cmp_ps(x, min_x, _CMP_LT_OQ);
  x = _mm256_max_ps(x, min_x);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - k ln2, with ln2 split in two so the product stays exact.
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(flush, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}
#endif

// x[i] = e^(x[i] - max) for every i, where max >= every x[i]; returns the sum of the results.
inline float exp_shifted_sum(float* x, int32_t n, float max) {
  int32_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 shift = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x + i), shift));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float lane : lanes) sum += lane;
#endif
  for (; i < n; ++i) sum += (x[i] = std::exp(x[i] - max));
  return sum;
}

}  // namespace se::cpu
