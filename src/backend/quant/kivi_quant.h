// KIVI's group quantizer (jy-yuan/KIVI, quant/new_pack.py, triton_quantize_and_pack_along_last_dim), one row at a
// time. A row of n elements is cut into groups of group_size consecutive elements (the last group may be
// shorter); each group stores its minimum mn and scale = (max - mn) / (2^b - 1), both fp16, and each element the
// b-bit code q = round_half_even(clamp((x - mn) / scale, 0, 2^b - 1)). Codes are packed 32 / b per uint32 word in
// row order, element j of a word at bits [j*b, j*b + b) (lowest first); a short last word has zero high bits.
// Dequantization is q * scale + mn. Every step rounds to fp16 as the reference's fp16 tensors do (the input is
// rounded to fp16 first), so codes, scales and minima are bit-identical to the reference for fp16 inputs.
// A constant group (scale 0, where the reference divides 0 by 0) stores code 0: it dequantizes to mn exactly.
//
// KV use: keys are quantized per channel (a row is one channel over group-aligned tokens, so `stride` steps
// across tokens), values per token (a row is one token's head_dim channels). Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#endif

namespace se {

inline int64_t kivi_num_groups(int64_t n, int32_t group_size) { return (n + group_size - 1) / group_size; }
inline int64_t kivi_num_words(int64_t n, int32_t bits) { return (n * bits + 31) / 32; }

// Code of element i of a packed row of kBits-bit codes.
template <int32_t kBits>
inline uint32_t kivi_code(const uint32_t* words, int64_t i) {
  constexpr int32_t kPerWord = 32 / kBits;
  return (words[i / kPerWord] >> ((i % kPerWord) * kBits)) & ((1u << kBits) - 1u);
}

// The same for bits 2, 4 or 8 known at run time: a branch the row loops predict, where dividing by 32 / bits per
// element would cost more than the rest of the decode.
inline uint32_t kivi_code(const uint32_t* words, int64_t i, int32_t bits) {
  switch (bits) {
    case 2:
      return kivi_code<2>(words, i);
    case 4:
      return kivi_code<4>(words, i);
    default:
      return kivi_code<8>(words, i);
  }
}

// x[i * stride], i < n -> words [kivi_num_words(n, bits)], scale and mn [kivi_num_groups(n, group_size)] (fp16
// bits). bits is 2, 4 or 8; group_size a positive multiple of 32 / bits, so groups start on word boundaries.
void kivi_quantize_row(const float* x, int64_t n, int64_t stride, int32_t group_size, int32_t bits,
                       uint32_t* words, uint16_t* scale, uint16_t* mn);

// The reference's dequantization, element i of the row: fp16(fp16(q * scale) + mn).
float kivi_dequantize(uint32_t code, uint16_t scale, uint16_t mn);

#if defined(__AVX2__) && defined(__F16C__)
// kivi_dequantize of 8 lanes: the same fp32 product and sum, each rounded to fp16 as there, so the bits match.
inline __m256 kivi_dequantize8(__m256i codes, __m256 scale, __m256 mn) {
  const auto to_f16 = [](__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  };
  return to_f16(_mm256_add_ps(to_f16(_mm256_mul_ps(_mm256_cvtepi32_ps(codes), scale)), mn));
}
#endif

// Every code's dequantized value under one (scale, mn): out[q] = kivi_dequantize(q, scale, mn), q < 2^bits. A group
// of n elements with fewer than n codes decodes faster by looking them up.
void kivi_code_values(uint16_t scale, uint16_t mn, int32_t bits, float* out);

// Whole row: out[i * stride], i < n (8 elements at a time where the CPU has AVX2 and F16C, a row is contiguous and
// groups are whole lanes; else by kivi_code_values' table where a group has more elements than codes).
void kivi_dequantize_row(const uint32_t* words, const uint16_t* scale, const uint16_t* mn, int64_t n,
                         int32_t group_size, int32_t bits, float* out, int64_t stride);

}  // namespace se
