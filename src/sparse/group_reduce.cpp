#include "sparse/group_reduce.h"

#include <algorithm>

namespace se {

// Row by row, so each pass is an element-wise loop that vectorizes (omp simd: GCC's -O2 cost model would keep it
// scalar for its alias check) without changing any result.
GroupReduce group_reduce_named(std::string_view name) {
  return name == "max" ? GroupReduce::kMax : name == "sum" ? GroupReduce::kSum : GroupReduce::kMean;
}

void reduce_group(const float* rows, int64_t stride, int32_t group, float* __restrict out, int32_t n, GroupReduce agg) {
  std::copy_n(rows, n, out);
  for (int32_t g = 1; g < group; ++g) {
    const float* __restrict row = rows + g * stride;
    if (agg == GroupReduce::kMax) {
#pragma omp simd
      for (int32_t j = 0; j < n; ++j) out[j] = std::max(out[j], row[j]);
    } else {
#pragma omp simd
      for (int32_t j = 0; j < n; ++j) out[j] += row[j];
    }
  }
  if (agg == GroupReduce::kMean) {
#pragma omp simd
    for (int32_t j = 0; j < n; ++j) out[j] /= static_cast<float>(group);
  }
}

}  // namespace se
