// The k largest scores of a row, as their indices in ascending order: what every scored eviction keeps. Ties
// break towards the lower index (torch.topk leaves them unspecified), so the kept set is deterministic.
#pragma once

#include <cstdint>
#include <vector>

namespace se {

// Fills `out` with the indices of the min(k, n) largest of scores[0, n), ascending. Linear in n: eviction methods call
// it for every stream at every decode step.
void top_k_ascending(const float* scores, int32_t n, int32_t k, std::vector<int32_t>& out);
std::vector<int32_t> top_k_ascending(const float* scores, int32_t n, int32_t k);

}  // namespace se
