#include "sparse/methods/recent_queries.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "base/check.h"

namespace se {

RecentQueries::RecentQueries(Tensor rows) : rows_(std::move(rows)) {
  SE_CHECK(rows_.dtype() == DType::kBF16 && rows_.rank() == 3 && rows_.numel() > 0,
           "RecentQueries: storage {} is not [layers, capacity, row] BF16", rows_.describe());
  num_layers_ = static_cast<int>(rows_.dim(0));
  capacity_ = static_cast<int32_t>(rows_.dim(1));
  row_elements_ = rows_.dim(2);
}

uint16_t* RecentQueries::row(int layer, int64_t index) const {
  return rows_.data<uint16_t>() + (int64_t{layer} * capacity_ + index) * row_elements_;
}

void RecentQueries::place_rows(int64_t first_row, int32_t n, std::vector<RowDestination>& destinations) {
  SE_CHECK(n >= 0 && first_row >= 0, "RecentQueries: rows [{}, {})", first_row, first_row + n);
  for (int32_t r = std::max(0, n - capacity_); r < n; ++r)
    destinations.push_back({first_row + r, row(0, (appended_ + r) % capacity_)});
  appended_ += n;
}

int32_t RecentQueries::size() const { return static_cast<int32_t>(std::min<int64_t>(appended_, capacity_)); }

void RecentQueries::newest(int layer, int32_t n, TensorView out) const {
  SE_CHECK(layer >= 0 && layer < num_layers_ && n <= size(),
           "RecentQueries: {} rows asked of layer {} of {}, which hold {}", n, layer, num_layers_, size());
  SE_CHECK(out.dtype == DType::kF32 && out.device == device() && out.numel() == int64_t{n} * row_elements_,
           "RecentQueries: out {} for {} rows", out.shape.to_string(), n);
  // At most two runs: the ring's rows up to its end, then those from its start.
  for (int32_t r = 0; r < n;) {
    const int64_t index = (appended_ - n + r) % capacity_;
    const auto run = static_cast<int32_t>(std::min<int64_t>(n - r, capacity_ - index));
    convert(TensorView{out.ptr<float>() + int64_t{r} * row_elements_, DType::kF32, {run, row_elements_}, device()},
            TensorView{row(layer, index), DType::kBF16, {run, row_elements_}, device()});
    r += run;
  }
}

}  // namespace se
