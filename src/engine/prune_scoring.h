// The scoring pass of a prefix-pruning policy (sparse/prune/prune_policy.h). snapkv_global scores on top of the
// engine's own cache when it can: a scratch sequence attaches the cached prefix before the window (locked, read
// only; a pruned segment's kept KV is what a request reusing it attends to, and its dropped positions score
// -inf) and computes only the tokens after it, the window among them, through a controller of its own (the
// engine's method never sees it); its pages go back right after, nothing is inserted into the prefix cache.
// Otherwise (too few free pages to take without evicting, kvzip_global's reconstruction passes) the tokens run
// through the model in a scratch sequence with a KV pool of its own on the model's device (TeacherForcedSequence;
// kResourceExhausted when the device lacks the memory). Either way neither running requests nor cached state
// change. Runs on the caller's thread (the engine thread, between steps).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "sparse/cache_manager.h"
#include "sparse/method_environment.h"
#include "sparse/prune/prune_policy.h"

namespace se {

struct PruneScoringOptions {
  PrunePolicy policy = PrunePolicy::kSnapKvGlobal;
  int32_t window = 32;  // snapkv_global's observation window
  int page_size = 16;
  MethodEnvironment environment;  // kvzip_global's repeat instruction and chat suffix
  CacheManager* cache = nullptr;  // the engine's cache, to score on top of its cached prefix (null: never)
};

// One score per token of `tokens` (higher = keep). Errors: the sequence is too short for the policy, or the
// scratch sequence could not run (memory).
Result<std::vector<float>> score_positions(const Model& model, std::span<const int32_t> tokens,
                                           const PruneScoringOptions& options);

}  // namespace se
