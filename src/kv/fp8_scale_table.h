// Fp8ScaleTable: the FP8 store's scales, one k_scale and one v_scale per (layer, KV head). A layer's scales are
// the checkpoint's where it ships them (fix), else computed from the first batch written to it (vLLM's
// calculate_kv_scales, per KV head: max|K| / 200 and max|V| / 100 over the head's rows), and stay fixed after, so every
// page of the pool, shared prefix pages and retained chains included, decodes with the scales it was written with.
// Owned by the cache; engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace se {

class Fp8ScaleTable {
 public:
  Fp8ScaleTable(int32_t num_layers, int32_t num_kv_heads);

  bool calibrated(int layer) const { return calibrated_[static_cast<size_t>(layer)] != 0; }
  // Fixes layer `layer`'s scales from the batch's new rows, once: k, v [T, num_kv_heads, D] host F32. Later calls
  // for the layer change nothing; a batch without rows
  // calibrates nothing.
  void calibrate(int layer, TensorView k, TensorView v);
  // Fixes layer `layer`'s scales to the given ones ([num_kv_heads] each, finite and positive) before anything is
  // written to it; calibrate then leaves the layer alone.
  void fix(int layer, const float* k_scales, const float* v_scales);

  // [num_kv_heads] scales of layer `layer` (1.0 until calibrated); the pointers stay valid for the table's life.
  const float* k_scales(int layer) const { return k_scales_.data() + static_cast<size_t>(layer) * num_kv_heads_; }
  const float* v_scales(int layer) const { return v_scales_.data() + static_cast<size_t>(layer) * num_kv_heads_; }

 private:
  int32_t num_kv_heads_;
  std::vector<float> k_scales_;                 // [num_layers][num_kv_heads]
  std::vector<float> v_scales_;                 // [num_layers][num_kv_heads]
  std::vector<uint8_t> calibrated_;             // [num_layers]
  std::vector<float> head_keys_, head_values_;  // scratch: one head's rows
};

}  // namespace se
