#include "backend/quant/kivi_quant.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "tensor/dtype.h"

namespace se {
namespace {

// An fp16 tensor op: computed in fp32 and rounded once to fp16 (exact for +, -, *, /: fp32 holds every fp16
// result to more than twice its precision, so the double rounding cannot differ).
float h(float f) { return f16_to_f32(f32_to_f16(f)); }

}  // namespace

void kivi_quantize_row(const float* x, int64_t n, int64_t stride, int32_t group_size, int32_t bits,
                       uint32_t* words, uint16_t* scale, uint16_t* mn) {
  SE_CHECK(bits == 2 || bits == 4 || bits == 8, "KIVI packs 2, 4 or 8 bits, not {}", bits);
  SE_CHECK(group_size > 0 && group_size % (32 / bits) == 0, "KIVI group {} is not whole words", group_size);
  const float max_code = static_cast<float>((1 << bits) - 1);
  std::fill(words, words + kivi_num_words(n, bits), 0u);
  const int32_t per_word = 32 / bits;
  for (int64_t g = 0; g * group_size < n; ++g) {
    const int64_t begin = g * group_size, end = std::min<int64_t>(n, begin + group_size);
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t i = begin; i < end; ++i) {
      const float v = h(x[i * stride]);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    const float s = h(h(hi - lo) / max_code);
    scale[g] = f32_to_f16(s);
    mn[g] = f32_to_f16(lo);
    for (int64_t i = begin; i < end; ++i) {
      uint32_t q = 0;
      if (s > 0.0f) {
        const float t = std::clamp(h(h(h(x[i * stride]) - lo) / s), 0.0f, max_code);
        q = static_cast<uint32_t>(std::nearbyint(t));  // round half to even, as torch.round
      }
      words[i / per_word] |= q << ((i % per_word) * bits);
    }
  }
}

float kivi_dequantize(uint32_t code, uint16_t scale, uint16_t mn) {
  return h(h(static_cast<float>(code) * f16_to_f32(scale)) + f16_to_f32(mn));
}

void kivi_code_values(uint16_t scale, uint16_t mn, int32_t bits, float* out) {
  for (uint32_t q = 0; q < (1u << bits); ++q) out[q] = kivi_dequantize(q, scale, mn);
}

#if defined(__AVX2__) && defined(__F16C__)
namespace {
// Codes of elements i .. i + 7 of a packed row, i a multiple of 8: one word's lanes for 2 and 4 bits, two words'
// bytes for 8.
__m256i kivi_codes8(const uint32_t* words, int64_t i, int32_t bits) {
  if (bits == 8)
    return _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint8_t*>(words) + i)));
  const int32_t per_word = 32 / bits, first = static_cast<int32_t>(i % per_word) * bits;
  const __m256i shifts = _mm256_add_epi32(
      _mm256_set1_epi32(first), _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bits)));
  const __m256i word = _mm256_set1_epi32(static_cast<int32_t>(words[i / per_word]));
  return _mm256_and_si256(_mm256_srlv_epi32(word, shifts), _mm256_set1_epi32((1 << bits) - 1));
}
}  // namespace
#endif

void kivi_dequantize_row(const uint32_t* words, const uint16_t* scale, const uint16_t* mn, int64_t n,
                         int32_t group_size, int32_t bits, float* out, int64_t stride) {
#if defined(__AVX2__) && defined(__F16C__)
  if (stride == 1 && group_size % 8 == 0) {
    const int64_t lanes = n - n % 8;
    for (int64_t i = 0; i < lanes; i += 8)
      _mm256_storeu_ps(out + i,
                       kivi_dequantize8(kivi_codes8(words, i, bits), _mm256_set1_ps(f16_to_f32(scale[i / group_size])),
                                        _mm256_set1_ps(f16_to_f32(mn[i / group_size]))));
    for (int64_t i = lanes; i < n; ++i)
      out[i] = kivi_dequantize(kivi_code(words, i, bits), scale[i / group_size], mn[i / group_size]);
    return;
  }
#endif
  if ((int64_t{1} << bits) >= group_size) {
    for (int64_t i = 0; i < n; ++i)
      out[i * stride] = kivi_dequantize(kivi_code(words, i, bits), scale[i / group_size], mn[i / group_size]);
    return;
  }
  // A group holds more elements than there are codes: each group's code values once, then lookups.
  float code_values[1 << 8];
  for (int64_t first = 0; first < n; first += group_size) {
    kivi_code_values(scale[first / group_size], mn[first / group_size], bits, code_values);
    for (int64_t i = first; i < std::min<int64_t>(n, first + group_size); ++i)
      out[i * stride] = code_values[kivi_code(words, i, bits)];
  }
}

}  // namespace se
