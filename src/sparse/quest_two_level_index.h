// Two-level page metadata (Spin, arXiv 2604.26837 §5) for Quest's key-bound selection: coarse summaries of groups
// of `group_size` consecutive pages stay resident (a group's bound is the elementwise min of its pages' mins and
// max of their maxes, so it bounds every key of the group), while the fine per-page bounds live on the host tier.
// Select ranks the groups by their bounds first, then the pages of the best `num_groups_kept` groups by their own,
// so a step reads the fine bounds of those groups only. The score is Quest's upper bound of q.k (page_key_bound_scores)
// reduced over a KV head's query group as select_pages_by_key_bounds does, and the last page is always read, as in
// flat Quest. An approximation: a page that flat Quest keeps is missed when its group's bound ranks below the kept
// groups (a group's bound is looser than its best page's); with every group kept it is flat Quest exactly.
// Host code over one stream; no state. Engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "kv/kv_layout.h"

namespace se {

struct TwoLevelConfig {
  int32_t group_size = 16;      // pages per coarse summary
  int32_t num_groups_kept = 4;  // groups whose pages Select ranks
};

// coarse [ceil(num_candidates / group_size), 2, D] from fine [>= num_candidates, 2, D]: group g summarizes candidate
// pages [g * group_size, min((g + 1) * group_size, num_candidates)).
void summarize_page_groups(std::span<const float> fine, int32_t num_candidates, int32_t head_dim, int32_t group_size,
                           std::span<float> coarse);

// The pages one KV head reads from a stream of `num_pages` pages: the last page and the best (page_budget - 1) of
// the others among the pages of the kept groups, ascending (ties to the lower index, at both levels); a stream of
// at most page_budget pages reads them all. q [group_heads, D] holds the head's query group; coarse summarizes the
// num_pages - 1 candidates (summarize_page_groups), fine [num_pages, 2, D]. `num_fine_read` (optional) counts the
// fine bounds ranked: what a step fetches from the host.
std::vector<int32_t> select_pages_two_level(std::span<const float> q, int32_t group_heads,
                                            std::span<const float> coarse, std::span<const float> fine,
                                            int32_t num_pages, int32_t head_dim, int32_t page_budget,
                                            GroupReduce reduce, const TwoLevelConfig& config,
                                            int64_t* num_fine_read = nullptr);

// Bytes of page key bounds for sequences of `num_tokens` tokens over `layout`: flat (every page's bounds on the
// device), or two-level (the groups' summaries on the device, every page's bounds on the host).
struct PageBoundBytes {
  int64_t device = 0;
  int64_t host = 0;
};
PageBoundBytes flat_page_bound_bytes(const KvLayout& layout, int64_t num_tokens);
PageBoundBytes two_level_page_bound_bytes(const KvLayout& layout, int64_t num_tokens, int32_t group_size);

}  // namespace se
