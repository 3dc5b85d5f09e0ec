// e4m3 codes on the device, as tensor/fp8.h converts them on the host: fp32 -> e4m3 rounds to nearest-even and
// saturates to +-448 (the same __nv_cvt_float_to_fp8 conversion vLLM's cache writes use), e4m3 -> fp32 is exact.
// Shared by the FP8 store's writes and its attention.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace se::cuda {

__device__ __forceinline__ uint8_t fp8_e4m3_code(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// Eight codes (element i in byte i of `codes`) times `scale`, as eight bf16 in element order: one 16-byte chunk of
// a bf16 row. An e4m3 value is exact in fp16, so the only rounding is the product's to bf16.
__device__ __forceinline__ uint4 fp8_e4m3x8_to_bf16x8(uint2 codes, float scale) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? codes.x : codes.y;
    const auto pair = static_cast<__nv_fp8x2_storage_t>(word >> (16 * (i & 1)));
    const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3));
    const float2 f = __half22float2(h);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace se::cuda
