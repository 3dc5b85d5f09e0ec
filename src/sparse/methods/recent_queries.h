// RecentQueries: the newest post-RoPE query rows of one sequence's decode tokens, per layer, in a ring of fixed
// capacity. Decode-time compression scores the cache with the queries of tokens decoded in earlier steps, which
// attention has long discarded, so the method keeps them. Host memory, filled lazily up to the capacity; engine
// thread only.
#pragma once

#include <cstdint>
#include <vector>

namespace se {

class RecentQueries {
 public:
  // `row_elements` = num_heads * head_dim of one query row.
  RecentQueries(int num_layers, int32_t capacity, int64_t row_elements);

  // Appends `n` rows [n, H, D] of layer `layer`; only the newest `capacity` are kept.
  void append(int layer, const float* rows, int32_t n);
  int num_layers() const { return static_cast<int>(layers_.size()); }
  int64_t row_elements() const { return row_elements_; }
  // Rows of `layer` held (min(appended, capacity)).
  int32_t size(int layer) const;
  // The newest `n` (<= size) rows of `layer`, oldest first, into out [n, H, D].
  void newest(int layer, int32_t n, float* out) const;

 private:
  struct Ring {
    std::vector<float> rows;  // [min(appended, capacity), H, D], row i of the stream at i % capacity
    int64_t appended = 0;
  };
  int32_t capacity_ = 0;
  int64_t row_elements_ = 0;
  std::vector<Ring> layers_;
};

}  // namespace se
