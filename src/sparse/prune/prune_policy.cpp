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

std::vector<float> kvzip_position_scores(std::span<const float> scores, int num_layers, int num_kv_heads,
                                         int32_t num_tokens) {
  std::vector<float> out(static_cast<size_t>(num_tokens), 0.0f);
  const float inv_heads = 1.0f / static_cast<float>(num_kv_heads);
  for (int stream = 0; stream < num_layers * num_kv_heads; ++stream) {
    const float* row = scores.data() + static_cast<size_t>(stream) * static_cast<size_t>(num_tokens);
    for (int32_t j = 0; j < num_tokens; ++j) out[static_cast<size_t>(j)] += row[j] * inv_heads;
  }
  return out;
}

std::vector<int32_t> kept_positions(std::span<const float> scores, TokenRange range, int32_t num_kept) {
  std::vector<int32_t> kept = top_k_ascending(scores.data() + range.start, range.end - range.start, num_kept);
  for (int32_t& position : kept) position += range.start;
  return kept;
}

}  // namespace se
