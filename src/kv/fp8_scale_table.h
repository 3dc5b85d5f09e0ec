// Fp8ScaleTable: the FP8 store's scales, one k_scale and one v_scale per (layer, KV head), kept where the pool is
// (host memory on the CPU, device memory on CUDA), so write_kv and attention read them in place. A layer's scales
// are the checkpoint's where it ships them (fix), else computed from the first batch written to it (vLLM's
// calculate_kv_scales, per KV head: max|K| / 200 and max|V| / 100 over the head's rows, by the fp8_kv_scales op on
// the pool's device: the rows never travel to the host), and stay fixed after, so every page of the pool, shared
// prefix pages and retained chains included, decodes with the scales it was written with. Owned by the cache;
// engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace se {

class Fp8ScaleTable {
 public:
  Fp8ScaleTable(int32_t num_layers, int32_t num_kv_heads, Device device = Device::kCpu);

  bool calibrated(int layer) const { return calibrated_[static_cast<size_t>(layer)] != 0; }
  // Fixes layer `layer`'s scales from the batch's new rows, once: k, v [T, num_kv_heads, D] on the table's device
  // (F32 on the CPU; F32 or BF16 on CUDA). Later calls for the layer change nothing; a batch without rows
  // calibrates nothing. On CUDA the scales are computed on the stream, ahead of the writes that read them.
  void calibrate(int layer, TensorView k, TensorView v);
  // Fixes layer `layer`'s scales to the given host values ([num_kv_heads] each, finite and positive) before
  // anything is written to it; calibrate then leaves the layer alone.
  void fix(int layer, const float* k_scales, const float* v_scales);

  // [num_kv_heads] scales of layer `layer` on the table's device (1.0 until calibrated); the pointers stay valid
  // for the table's life.
  const float* k_scales(int layer) const { return scales(0, layer); }
  const float* v_scales(int layer) const { return scales(1, layer); }

 private:
  float* scales(int kv, int layer) const;

  int32_t num_layers_;
  int32_t num_kv_heads_;
  Device device_;
  Tensor scales_;                    // [2 (K, V)][num_layers][num_kv_heads] F32 on device_
  std::vector<uint8_t> calibrated_;  // [num_layers]
};

}  // namespace se
