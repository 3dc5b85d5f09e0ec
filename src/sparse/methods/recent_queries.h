// RecentQueries: the newest post-RoPE query rows of one sequence's decode tokens, per layer, in a ring of fixed
// capacity. Decode-time compression scores the cache with the queries of tokens decoded in earlier steps, which
// attention has long discarded, so the method keeps them. The ring lives where the step's queries do (device
// memory beside a GPU) and holds them in bf16 on every device (R-KV's reference runs its model in bf16, so its
// queries are bf16, and the CPU then keeps the GPU's bits); rows go in and come out through backend ops enqueued
// there, so keeping them costs a decode step no trip to the host. Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "tensor/tensor.h"

namespace se {

class RecentQueries {
 public:
  // `rows` [num_layers, capacity, num_heads * head_dim] BF16 (any contents): the rings' storage, on the device whose
  // query rows they keep.
  explicit RecentQueries(Tensor rows);

  // The storage back, for another sequence's rings (no allocation, and on a GPU no free that waits for the device).
  Tensor release() && { return std::move(rows_); }

  // Appends rows [first_row, first_row + n) of a step's queries [T, H, D] F32 to every layer's ring, before the
  // forward computes them: adds to `destinations` where each of the newest min(n, capacity) of them goes in layer
  // 0's ring (older ones would be overwritten within the step), for the caller to copy each layer's rows with
  // scatter_rows_to_bf16(queries, table, layer * layer_stride()) before the ring is read, every ring's rows of a
  // layer in one call.
  void place_rows(int64_t first_row, int32_t n, std::vector<RowDestination>& destinations);
  int num_layers() const { return num_layers_; }
  int64_t row_elements() const { return row_elements_; }
  // Elements from one layer's ring to the next's, the same in every ring of one capacity and row size.
  int64_t layer_stride() const { return int64_t{capacity_} * row_elements_; }
  Device device() const { return rows_.device(); }
  // Rows held in each layer's ring (min(appended, capacity)).
  int32_t size() const;
  // The newest `n` (<= size) rows of `layer`, oldest first, widened into out [n, H, D] F32 on the ring's device.
  void newest(int layer, int32_t n, TensorView out) const;

 private:
  // Row `index` (< capacity) of `layer`'s ring.
  uint16_t* row(int layer, int64_t index) const;

  int num_layers_ = 0;
  int32_t capacity_ = 0;
  int64_t row_elements_ = 0;
  Tensor rows_;           // [num_layers, capacity, H * D] BF16: row i of a layer's stream at i % capacity
  int64_t appended_ = 0;  // rows appended to each layer so far
};

}  // namespace se
