#include "kv/fp8_scale_table.h"

#include <algorithm>

#include "backend/quant/fp8_kv.h"
#include "base/check.h"

namespace se {

Fp8ScaleTable::Fp8ScaleTable(int32_t num_layers, int32_t num_kv_heads)
    : num_kv_heads_(num_kv_heads),
      k_scales_(static_cast<size_t>(num_layers) * num_kv_heads, 1.0f),
      v_scales_(static_cast<size_t>(num_layers) * num_kv_heads, 1.0f),
      calibrated_(static_cast<size_t>(num_layers), 0) {}

void Fp8ScaleTable::fix(int layer, const float* k_scales, const float* v_scales) {
  SE_CHECK(layer >= 0 && static_cast<size_t>(layer) < calibrated_.size(), "fp8 scales: no layer {}", layer);
  const size_t at = static_cast<size_t>(layer) * num_kv_heads_;
  std::copy_n(k_scales, num_kv_heads_, k_scales_.begin() + static_cast<std::ptrdiff_t>(at));
  std::copy_n(v_scales, num_kv_heads_, v_scales_.begin() + static_cast<std::ptrdiff_t>(at));
  calibrated_[static_cast<size_t>(layer)] = 1;
}

void Fp8ScaleTable::calibrate(int layer, TensorView k, TensorView v) {
  SE_CHECK(layer >= 0 && static_cast<size_t>(layer) < calibrated_.size(), "fp8 scales: no layer {}", layer);
  if (calibrated(layer)) return;
  SE_CHECK(k.device == Device::kCpu && k.dtype == DType::kF32 && v.device == Device::kCpu && v.dtype == DType::kF32 &&
               k.shape.rank() == 3 && k.shape[1] == num_kv_heads_ && v.shape == k.shape,
           "fp8 scales: k {} v {} for {} KV heads (host f32)", k.shape.to_string(), v.shape.to_string(), num_kv_heads_);
  const int64_t rows = k.shape[0], dim = k.shape[2];
  if (rows == 0) return;  // nothing to measure: the first batch with rows fixes the scales
  head_keys_.resize(static_cast<size_t>(rows * dim));
  head_values_.resize(static_cast<size_t>(rows * dim));
  for (int32_t h = 0; h < num_kv_heads_; ++h) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t src = (r * num_kv_heads_ + h) * dim;
      std::copy_n(k.ptr<float>() + src, dim, head_keys_.data() + r * dim);
      std::copy_n(v.ptr<float>() + src, dim, head_values_.data() + r * dim);
    }
    const Fp8KvScales s =
        fp8_kv_scales_from_batch(head_keys_.data(), head_keys_.size(), head_values_.data(), head_values_.size());
    const size_t at = static_cast<size_t>(layer) * num_kv_heads_ + static_cast<size_t>(h);
    k_scales_[at] = s.k(0);
    v_scales_[at] = s.v(0);
  }
  calibrated_[static_cast<size_t>(layer)] = 1;
}

}  // namespace se
