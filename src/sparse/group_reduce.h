// A KV head's query group reduced to one row of scores: what the scored methods do before they rank per KV head
// (the observation-window family, accumulated-attention eviction). Mean, max or sum over the group, folded head by head
// in order.
#pragma once

#include <cstdint>

namespace se {

enum class GroupAgg : uint8_t { kMean, kMax, kSum };

// out[j] = agg over g < group of rows[g * stride + j], j < n: out[j] = rows[j], then each later row folded in, the
// mean divided by the group at the end. out must not overlap rows.
void reduce_group(const float* rows, int64_t stride, int32_t group, float* out, int32_t n, GroupAgg agg);

}  // namespace se
