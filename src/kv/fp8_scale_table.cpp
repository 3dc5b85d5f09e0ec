#include "kv/fp8_scale_table.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "backend/ops.h"
#include "base/check.h"

namespace se {

Fp8ScaleTable::Fp8ScaleTable(int32_t num_layers, int32_t num_kv_heads, Device device)
    : num_layers_(num_layers),
      num_kv_heads_(num_kv_heads),
      device_(device),
      calibrated_(static_cast<size_t>(num_layers), 0) {
  Tensor ones = Tensor::empty(DType::kF32, {2, num_layers, num_kv_heads});
  std::fill_n(ones.data<float>(), ones.numel(), 1.0f);
  scales_ = to_device(ones, device);
}

float* Fp8ScaleTable::scales(int kv, int layer) const {
  return static_cast<float*>(scales_.raw()) + (static_cast<int64_t>(kv) * num_layers_ + layer) * num_kv_heads_;
}

void Fp8ScaleTable::fix(int layer, const float* k_scales, const float* v_scales) {
  SE_CHECK(layer >= 0 && layer < num_layers_, "fp8 scales: no layer {}", layer);
  const size_t bytes = static_cast<size_t>(num_kv_heads_) * sizeof(float);
  copy_bytes(device_, scales(0, layer), k_scales, bytes);
  copy_bytes(device_, scales(1, layer), v_scales, bytes);
  calibrated_[static_cast<size_t>(layer)] = 1;
}

void Fp8ScaleTable::calibrate(int layer, TensorView k, TensorView v) {
  SE_CHECK(layer >= 0 && layer < num_layers_, "fp8 scales: no layer {}", layer);
  if (calibrated(layer)) return;
  SE_CHECK(k.device == device_ && v.device == device_ && k.shape.rank() == 3 && k.shape[1] == num_kv_heads_ &&
               v.shape == k.shape,
           "fp8 scales: k {} v {} on {} for {} KV heads on {}", k.shape.to_string(), v.shape.to_string(),
           device_name(k.device), num_kv_heads_, device_name(device_));
  if (k.shape[0] == 0) return;  // nothing to measure: the first batch with rows fixes the scales
  const Shape heads{num_kv_heads_};
  fp8_kv_scales(TensorView{scales(0, layer), DType::kF32, heads, device_},
                TensorView{scales(1, layer), DType::kF32, heads, device_}, k, v);
  calibrated_[static_cast<size_t>(layer)] = 1;
}

}  // namespace se
