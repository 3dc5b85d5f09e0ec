// TurboQuantChannelTable: the outlier channels of the paper's TurboQuant store (turboquant_2.5|3.5,
// backend/quant/turboquant_prod_kv.h), one split per (layer, KV head) for keys and one for values. The paper does
// not say how outlier channels are chosen; ours: a layer's split is fixed by the first batch written to it (as the
// FP8 store's scales are, kv/fp8_scale_table.h), per KV head the head_dim / 2 channels of largest energy (sum of
// squares over the batch's rows, select_outlier_channels) of its keys and, apart, of its values, and it stays fixed
// after, so every slot of the pool, shared prefix pages and retained chains included, decodes with the split it
// was written with. Owned by the cache; engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace se {

class TurboQuantChannelTable {
 public:
  TurboQuantChannelTable(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim);

  bool calibrated(int layer) const { return calibrated_[static_cast<size_t>(layer)] != 0; }
  // Fixes layer `layer`'s splits from the batch's new rows, once: k, v [T, num_kv_heads, head_dim] host F32 (any
  // shape of that many elements). Later calls for the layer change nothing; a batch without rows fixes nothing.
  void calibrate(int layer, TensorView k, TensorView v);

  // [num_kv_heads][head_dim] channel orders of layer `layer` (outlier_channel_order; channels 0.. head_dim / 2 - 1
  // as outliers until calibrated); the pointers stay valid for the table's life.
  const int32_t* key_orders(int layer) const { return key_orders_.data() + offset(layer); }
  const int32_t* value_orders(int layer) const { return value_orders_.data() + offset(layer); }

 private:
  size_t offset(int layer) const { return static_cast<size_t>(layer) * num_kv_heads_ * head_dim_; }

  int32_t num_kv_heads_;
  int32_t head_dim_;
  std::vector<int32_t> key_orders_;    // [num_layers][num_kv_heads][head_dim]
  std::vector<int32_t> value_orders_;  // [num_layers][num_kv_heads][head_dim]
  std::vector<uint8_t> calibrated_;    // [num_layers]
  std::vector<float> head_rows_;       // scratch: one head's rows
};

}  // namespace se
