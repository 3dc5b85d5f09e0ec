// FP8 scalar conversions (OCP formats): e4m3fn (4 exponent bits, bias 7, no infinities, one NaN pattern per
// sign, largest finite 448) and e5m2 (5 exponent bits, bias 15, IEEE-like with infinities, largest finite 57344).
// fp32 -> fp8 rounds to nearest-even and saturates to the largest finite value, as CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) does and as vLLM's KV-cache writes use it: an out-of-range or
// infinite input becomes +-max, NaN stays NaN. fp8 -> fp32 is exact. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace se {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };

// Largest finite magnitude of the format (448 for e4m3fn, 57344 for e5m2).
float fp8_max_finite(Fp8Format format);

uint8_t f32_to_fp8_satfinite(float f, Fp8Format format);
float fp8_to_f32(uint8_t code, Fp8Format format);
// fp8_to_f32 of every code [256], for loops that convert many codes.
const float* fp8_code_values(Fp8Format format);

}  // namespace se
