#include "backend/quant/fp8_kv.h"

#include <cmath>

namespace se {
namespace {

float abs_max(const float* x, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

Result<std::vector<float>> checked_scales(const std::vector<float>& s, const char* name, int32_t num_kv_heads) {
  if (s.size() != 1 && s.size() != static_cast<size_t>(num_kv_heads))
    return invalid_argument("{} has {} values; expected 1 (per tensor) or {} (per KV head)", name, s.size(),
                            num_kv_heads);
  for (float v : s)
    if (!(std::isfinite(v) && v > 0.0f)) return invalid_argument("{} holds {}; scales must be positive", name, v);
  return s;
}

}  // namespace

Fp8KvScales fp8_kv_scales_from_batch(const float* keys, size_t num_keys, const float* values, size_t num_values) {
  return Fp8KvScales{{fp8_scale_from_max(abs_max(keys, num_keys), kFp8KeyScaleDivisor)},
                     {fp8_scale_from_max(abs_max(values, num_values), kFp8ValueScaleDivisor)}};
}

Result<Fp8KvScales> fp8_kv_scales_from_checkpoint(const std::optional<std::vector<float>>& k_scale,
                                                  const std::optional<std::vector<float>>& v_scale,
                                                  const std::optional<std::vector<float>>& kv_scale,
                                                  int32_t num_kv_heads) {
  const std::optional<std::vector<float>>& k = k_scale ? k_scale : kv_scale;
  const std::optional<std::vector<float>>& v = v_scale ? v_scale : kv_scale;
  if (!k || !v) return invalid_argument("FP8 KV scales: the checkpoint has no k_scale/v_scale (nor kv_scale)");
  Fp8KvScales out;
  SE_ASSIGN_OR_RETURN(out.k_scale, checked_scales(*k, "k_scale", num_kv_heads));
  SE_ASSIGN_OR_RETURN(out.v_scale, checked_scales(*v, "v_scale", num_kv_heads));
  return out;
}

void fp8_quantize(const float* x, size_t n, float scale, Fp8Format format, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_fp8_satfinite(x[i] / scale, format);
}

void fp8_dequantize(const uint8_t* codes, size_t n, float scale, Fp8Format format, float* out) {
  const float* values = fp8_code_values(format);
  for (size_t i = 0; i < n; ++i) out[i] = values[codes[i]] * scale;
}

}  // namespace se
