#include "sparse/prune/prune_policy.h"

#include "sparse/methods/observation_window_scores.h"
#include "base/top_k.h"

namespace se {

std::optional<PrunePolicy> parse_prune_policy(std::string_view name) {
  if (name == "snapkv_global") return PrunePolicy::kSnapKvGlobal;
  if (name == "kvzip_global") return PrunePolicy::kKvzipGlobal;
  return std::nullopt;
}

std::string_view prune_policy_name(PrunePolicy policy) {
  return policy == PrunePolicy::kSnapKvGlobal ? "snapkv_global" : "kvzip_global";
}

std::vector<int32_t> kept_positions(std::span<const float> scores, TokenRange range, int32_t num_kept) {
  std::vector<int32_t> kept = top_k_ascending(scores.data() + range.start, range.end - range.start, num_kept);
  for (int32_t& position : kept) position += range.start;
  return kept;
}

}  // namespace se
