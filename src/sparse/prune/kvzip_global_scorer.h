// The `kvzip_global` prefix-pruning policy's scorer (prune_scorer.h): a scratch sequence runs the kvzip method
// (methods/kvzip.h, steps 2-3, n_sink = 0, every position context) and its reconstruction scores become one score
// per position: the mean over KV heads, summed over layers (the method already takes the max over each KV head's
// query group and repeat rows; it does not pool, so neither does this). This file belongs to that method.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "sparse/prune/prune_scorer.h"

namespace se {

std::unique_ptr<PruneScorer> make_kvzip_global_prune_scorer(const PruneScorerOptions& options);

// One score per position from the method's scores [num_layers][num_kv_heads][num_tokens].
std::vector<float> kvzip_position_scores(std::span<const float> scores, int num_layers, int num_kv_heads,
                                         int32_t num_tokens);

}  // namespace se
