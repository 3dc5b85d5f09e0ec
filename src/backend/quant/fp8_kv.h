// FP8 KV-cache numerics as vLLM defines them (`--kv-cache-dtype fp8|fp8_e4m3|fp8_e5m2`): a stored element is
// cvt_satfinite(x / scale) and reads back as float(fp8) * scale. Scales are fp32, per tensor (one k_scale and one
// v_scale per attention layer, vLLM's default) or per KV head. They come from the checkpoint (a lone kv_scale
// serves both), or are computed once from the first batch as vLLM's calculate_kv_scales does:
// k_scale = max|K| / 200, v_scale = max|V| / 100, and stay fixed after. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "base/status.h"
#include "tensor/fp8.h"

namespace se {

// vLLM's K_SCALE_CONSTANT and V_SCALE_CONSTANT defaults.
inline constexpr float kFp8KeyScaleDivisor = 200.0f;
inline constexpr float kFp8ValueScaleDivisor = 100.0f;

// calculate_kv_scales' scale from a maximum magnitude: max_abs / divisor, 1.0 for 0 (nothing to divide by).
inline float fp8_scale_from_max(float max_abs, float divisor) { return max_abs > 0.0f ? max_abs / divisor : 1.0f; }

// One layer's scales: size 1 (per tensor) or num_kv_heads (per head).
struct Fp8KvScales {
  std::vector<float> k_scale;
  std::vector<float> v_scale;

  // The scale KV head `head` uses.
  float k(int32_t head) const { return k_scale.size() == 1 ? k_scale[0] : k_scale[head]; }
  float v(int32_t head) const { return v_scale.size() == 1 ? v_scale[0] : v_scale[head]; }
};

// calculate_kv_scales on the first batch: keys and values are any number of fp32 elements (every head, every
// token of the batch). A batch whose maximum is 0 (or that is empty) gives scale 1.0 rather than dividing by 0.
Fp8KvScales fp8_kv_scales_from_batch(const float* keys, size_t num_keys, const float* values, size_t num_values);

// Checkpoint scales: each given tensor holds 1 or num_kv_heads positive finite values; a lone kv_scale is used
// for both K and V. Anything else (no scale, a wrong count, a non-positive or non-finite value) is an error.
Result<Fp8KvScales> fp8_kv_scales_from_checkpoint(const std::optional<std::vector<float>>& k_scale,
                                                  const std::optional<std::vector<float>>& v_scale,
                                                  const std::optional<std::vector<float>>& kv_scale,
                                                  int32_t num_kv_heads);

// out[i] = cvt_satfinite(x[i] / scale).
void fp8_quantize(const float* x, size_t n, float scale, Fp8Format format, uint8_t* out);
// out[i] = float(codes[i]) * scale.
void fp8_dequantize(const uint8_t* codes, size_t n, float scale, Fp8Format format, float* out);

}  // namespace se
