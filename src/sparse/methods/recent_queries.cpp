#include "sparse/methods/recent_queries.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "base/check.h"

namespace se {

RecentQueries::RecentQueries(Tensor rows) : rows_(std::move(rows)) {
  SE_CHECK(rows_.dtype() == DType::kF32 && rows_.rank() == 3 && rows_.numel() > 0,
           "RecentQueries: storage {} is not [layers, capacity, row] F32", rows_.describe());
  capacity_ = static_cast<int32_t>(rows_.dim(1));
  row_elements_ = rows_.dim(2);
  appended_.assign(static_cast<size_t>(rows_.dim(0)), 0);
}

float* RecentQueries::row(int layer, int64_t index) const {
  return rows_.data<float>() + (int64_t{layer} * capacity_ + index) * row_elements_;
}

void RecentQueries::append(int layer, TensorView rows) {
  SE_CHECK(rows.dtype == DType::kF32 && rows.device == device() && rows.shape.rank() == 3 &&
               rows.shape[1] * rows.shape[2] == row_elements_,
           "RecentQueries: rows {} {} on {} for a ring of {}-element F32 rows on {}", dtype_name(rows.dtype),
           rows.shape.to_string(), device_name(rows.device), row_elements_, device_name(device()));
  const auto n = static_cast<int32_t>(rows.shape[0]);
  int64_t& appended = appended_[static_cast<size_t>(layer)];
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row_elements_);
  // Rows that the ring would overwrite within this call are skipped; the rest wrap at most once.
  for (int32_t r = std::max(0, n - capacity_); r < n;) {
    const int64_t index = (appended + r) % capacity_;
    const auto run = static_cast<int32_t>(std::min<int64_t>(n - r, capacity_ - index));
    copy_rows_async(device(), row(layer, index), row_bytes, rows.ptr<float>() + int64_t{r} * row_elements_, row_bytes,
                    row_bytes, static_cast<size_t>(run));
    r += run;
  }
  appended += n;
}

int32_t RecentQueries::size(int layer) const {
  return static_cast<int32_t>(std::min<int64_t>(appended_[static_cast<size_t>(layer)], capacity_));
}

void RecentQueries::newest(int layer, int32_t n, TensorView out) const {
  SE_CHECK(n <= size(layer), "RecentQueries: {} rows asked of layer {}, which holds {}", n, layer, size(layer));
  SE_CHECK(out.dtype == DType::kF32 && out.device == device() && out.numel() == int64_t{n} * row_elements_,
           "RecentQueries: out {} for {} rows", out.shape.to_string(), n);
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row_elements_);
  const int64_t appended = appended_[static_cast<size_t>(layer)];
  for (int32_t r = 0; r < n;) {
    const int64_t index = (appended - n + r) % capacity_;
    const auto run = static_cast<int32_t>(std::min<int64_t>(n - r, capacity_ - index));
    copy_rows_async(device(), out.ptr<float>() + int64_t{r} * row_elements_, row_bytes, row(layer, index), row_bytes,
                    row_bytes, static_cast<size_t>(run));
    r += run;
  }
}

}  // namespace se
