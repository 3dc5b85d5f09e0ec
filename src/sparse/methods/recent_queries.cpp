#include "sparse/methods/recent_queries.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"

namespace se {

RecentQueries::RecentQueries(int num_layers, int32_t capacity, int64_t row_elements)
    : capacity_(capacity), row_elements_(row_elements), layers_(static_cast<size_t>(num_layers)) {
  SE_CHECK(capacity > 0 && row_elements > 0, "RecentQueries: capacity {} x {} elements", capacity, row_elements);
}

void RecentQueries::append(int layer, const float* rows, int32_t n) {
  Ring& ring = layers_[static_cast<size_t>(layer)];
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row_elements_);
  // Rows that the ring would overwrite within this call are skipped.
  const int32_t skipped = std::max(0, n - capacity_);
  for (int32_t r = skipped; r < n; ++r) {
    const int64_t index = (ring.appended + r) % capacity_;
    if (index * row_elements_ >= static_cast<int64_t>(ring.rows.size()))
      ring.rows.resize(static_cast<size_t>((index + 1) * row_elements_));
    std::memcpy(ring.rows.data() + index * row_elements_, rows + r * row_elements_, row_bytes);
  }
  ring.appended += n;
}

int32_t RecentQueries::size(int layer) const {
  return static_cast<int32_t>(std::min<int64_t>(layers_[static_cast<size_t>(layer)].appended, capacity_));
}

void RecentQueries::newest(int layer, int32_t n, float* out) const {
  const Ring& ring = layers_[static_cast<size_t>(layer)];
  SE_CHECK(n <= size(layer), "RecentQueries: {} rows asked of layer {}, which holds {}", n, layer, size(layer));
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row_elements_);
  for (int32_t r = 0; r < n; ++r) {
    const int64_t index = (ring.appended - n + r) % capacity_;
    std::memcpy(out + r * row_elements_, ring.rows.data() + index * row_elements_, row_bytes);
  }
}

}  // namespace se
