// Element types and their scalar conversions. Conversions are exact where the format allows and round to
// nearest-even otherwise (fp32 -> fp16/bf16), matching numpy and PyTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace se {

enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kI8 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);

// IEEE half <-> float.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// bfloat16 <-> float (bf16 is the upper half of an fp32; rounding is to nearest-even, NaN stays NaN).
inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Converts `n` elements of `src_dtype` (F32/F16/BF16) into fp32.
void convert_to_f32(const void* src, DType src_dtype, float* dst, size_t n);
// Converts `n` fp32 elements into `dst_dtype` (F32/F16/BF16).
void convert_from_f32(const float* src, void* dst, DType dst_dtype, size_t n);

}  // namespace se
