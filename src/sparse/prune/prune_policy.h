// The prefix-pruning policies (kv/prefix_prune.h): how each turns its scoring pass into one score per
// position, and how a keep mask is cut from those scores. Plain functions; thread-compatible.
//   snapkv_global  window attention of the sequence's last tokens (snapkv_global_scorer.h)
//   kvzip_global   KVzip's context-reconstruction scores (methods/kvzip.h, steps 2-3, n_sink = 0): per position
//                  the mean over KV heads, summed over layers (KVzip already takes the max over each KV head's
//                  query group and repeat rows; it does not pool, so neither does this)
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

// One score per position from KVzip's scores [num_layers][num_kv_heads][num_tokens].
std::vector<float> kvzip_position_scores(std::span<const float> scores, int num_layers, int num_kv_heads,
                                         int32_t num_tokens);

// The positions range `range` keeps: the top `num_kept` by `scores` (one per position of the whole sequence)
// among the range's positions, ascending (ties: the lower position). The policy's own keep mask is the top
// `keep_tokens`; the radix cache keeps whole pages, so there the next-best positions fill the last page.
std::vector<int32_t> kept_positions(std::span<const float> scores, TokenRange range, int32_t num_kept);

}  // namespace se
