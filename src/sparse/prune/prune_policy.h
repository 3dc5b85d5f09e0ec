// The prefix-pruning policies (kv/prefix_prune.h): how each turns its scoring pass into one score per
// position, and how a keep mask is cut from those scores. Plain functions; thread-compatible.
//   snapkv_global  window attention of the sequence's last tokens (snapkv_global_scorer.h)
//   kvzip_global   context-reconstruction scores (kvzip_global_scorer.h)
// Each policy's scoring pass is a PruneScorer (prune_scorer.h); a policy's scorer file belongs to the method
// whose scores it reads.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kv/prefix_prune.h"

namespace se {

enum class PrunePolicy : uint8_t { kSnapKvGlobal, kKvzipGlobal };

// nullopt for an unknown name.
std::optional<PrunePolicy> parse_prune_policy(std::string_view name);
std::string_view prune_policy_name(PrunePolicy policy);

// The positions range `range` keeps: the top `num_kept` by `scores` (one per position of the whole sequence)
// among the range's positions, ascending (ties: the lower position). The policy's own keep mask is the top
// `keep_tokens`; the radix cache keeps whole pages, so there the next-best positions fill the last page.
std::vector<int32_t> kept_positions(std::span<const float> scores, TokenRange range, int32_t num_kept);

}  // namespace se
