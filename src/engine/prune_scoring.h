// The scoring pass of a prefix-pruning policy (sparse/prune/prune_policy.h): the tokens run through the model
// in a scratch sequence with its own CPU KV pool (TeacherForcedSequence), so neither running requests nor any
// cached state is touched. Runs on the caller's thread (the engine thread, between steps).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "sparse/method_environment.h"
#include "sparse/prune/prune_policy.h"

namespace se {

struct PruneScoringOptions {
  PrunePolicy policy = PrunePolicy::kSnapKvGlobal;
  int32_t window = 32;  // snapkv_global's observation window
  int page_size = 16;
  MethodEnvironment environment;  // kvzip_global's repeat instruction and chat suffix
};

// One score per token of `tokens` (higher = keep). Errors: the sequence is too short for the policy, or the
// scratch sequence could not run (memory).
Result<std::vector<float>> score_positions(const Model& model, std::span<const int32_t> tokens,
                                           const PruneScoringOptions& options);

}  // namespace se
