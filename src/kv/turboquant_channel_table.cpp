#include "kv/turboquant_channel_table.h"

#include <algorithm>
#include <numeric>

#include "backend/quant/turboquant.h"
#include "backend/quant/turboquant_kv.h"
#include "base/check.h"

namespace se {

TurboQuantChannelTable::TurboQuantChannelTable(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim)
    : num_kv_heads_(num_kv_heads),
      head_dim_(head_dim),
      key_orders_(static_cast<size_t>(num_layers) * num_kv_heads * head_dim),
      value_orders_(key_orders_.size()),
      calibrated_(static_cast<size_t>(num_layers), 0) {
  for (size_t at = 0; at < key_orders_.size(); at += static_cast<size_t>(head_dim)) {
    std::iota(key_orders_.begin() + static_cast<std::ptrdiff_t>(at),
              key_orders_.begin() + static_cast<std::ptrdiff_t>(at) + head_dim, 0);
    std::iota(value_orders_.begin() + static_cast<std::ptrdiff_t>(at),
              value_orders_.begin() + static_cast<std::ptrdiff_t>(at) + head_dim, 0);
  }
}

void TurboQuantChannelTable::calibrate(int layer, TensorView k, TensorView v) {
  SE_CHECK(layer >= 0 && static_cast<size_t>(layer) < calibrated_.size(), "turboquant channels: no layer {}", layer);
  if (calibrated(layer)) return;
  const int64_t row = int64_t{num_kv_heads_} * head_dim_;
  SE_CHECK(k.device == Device::kCpu && k.dtype == DType::kF32 && v.device == Device::kCpu && v.dtype == DType::kF32 &&
               k.numel() % row == 0 && v.numel() == k.numel(),
           "turboquant channels: k {} v {} for {} KV heads x {} (host f32)", k.shape.to_string(), v.shape.to_string(),
           num_kv_heads_, head_dim_);
  const int64_t rows = k.numel() / row;
  if (rows == 0) return;  // nothing to measure: the first batch with rows fixes the split
  head_rows_.resize(static_cast<size_t>(rows * head_dim_));
  const int32_t outliers = turboquant_num_outliers(head_dim_);
  for (const auto& [source, orders] : {std::pair{k, &key_orders_}, std::pair{v, &value_orders_}})
    for (int32_t h = 0; h < num_kv_heads_; ++h) {
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(source.ptr<float>() + r * row + int64_t{h} * head_dim_, head_dim_,
                    head_rows_.data() + r * head_dim_);
      const std::vector<int32_t> order =
          outlier_channel_order(select_outlier_channels(head_rows_.data(), rows, head_dim_, outliers), head_dim_);
      std::copy(order.begin(), order.end(),
                orders->begin() + static_cast<std::ptrdiff_t>(offset(layer) + static_cast<size_t>(h) * head_dim_));
    }
  calibrated_[static_cast<size_t>(layer)] = 1;
}

}  // namespace se
