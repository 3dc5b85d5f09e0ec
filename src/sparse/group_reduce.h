// A KV head's query group reduced to one row of scores: what the scored methods do before they rank per KV head
// (the observation-window family, accumulated-attention eviction). Mean, max or sum over the group, folded head by head
// in order.
#pragma once

#include <cstdint>
#include <string_view>

#include "backend/ops.h"

namespace se {

// The reduction a `gqa_agg` config value names: "max", "sum", else the mean (the config's choices are validated
// where it is read).
GroupReduce group_reduce_named(std::string_view name);

// out[j] = agg over g < group of rows[g * stride + j], j < n: out[j] = rows[j], then each later row folded in, the
// mean divided by the group at the end. out must not overlap rows.
void reduce_group(const float* rows, int64_t stride, int32_t group, float* out, int32_t n, GroupReduce agg);

}  // namespace se
