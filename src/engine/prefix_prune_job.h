// Prefix-pruning jobs (kv/prefix_prune.h) as the engine runs them: a PruneRequest names token ranges of a
// cached prefix, a policy and how many positions each range keeps; the engine thread runs it between steps
// (run_prune) and records the outcome in a PruneStatusBoard that HTTP threads read. A prune either changes
// every range it can or, when a range block is in use by a running request, nothing ("blocked").
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/prefix_prune.h"
#include "model/model.h"
#include "sparse/method_environment.h"
#include "sparse/method_runtime.h"
#include "sparse/prune/prune_policy.h"

namespace se {

struct PruneRequest {
  std::vector<int32_t> token_ids;
  std::vector<TokenRange> ranges;  // ascending, non-overlapping, inside token_ids
  int32_t keep_tokens = 0;         // positions each range keeps (before rounding up to whole pages)
  PrunePolicy policy = PrunePolicy::kSnapKvGlobal;
  int32_t window = 32;  // snapkv_global's observation window
};

// Ok, or kInvalidArgument naming what is wrong (empty tokens or ranges, a range outside the tokens, empty,
// overlapping or out of order, keep_tokens outside [0, range size], window < 1).
Status validate_prune_request(const PruneRequest& request);

enum class PruneState : uint8_t { kQueued, kCompleted, kBlocked, kFailed };
std::string_view prune_state_name(PruneState state);

struct PruneStatus {
  std::string prune_id;
  PruneState state = PruneState::kQueued;
  std::string reason;               // blocked or failed: why
  std::vector<PrunedRange> ranges;  // completed: one per requested range
  int32_t num_freed_pages = 0;      // completed: over all ranges
};

// Runs `request` against `cache` on the engine thread: narrows each range to its cached blocks, refuses
// (blocked, nothing changed) when one is in use, scores the tokens with the policy in a scratch sequence,
// keeps each range's best positions rounded up to whole pages and prunes; `method` refreshes its per-page
// metadata of the rewritten pages. Returns the final status (state completed, blocked or failed).
PruneStatus run_prune(const PruneRequest& request, CacheManager& cache, MethodRuntime& method, const Model& model,
                      const MethodEnvironment& environment);

// The statuses of the latest prunes by id, for HTTP threads. Thread-safe; keeps the newest kCapacity.
class PruneStatusBoard {
 public:
  static constexpr size_t kCapacity = 1024;

  // A new id, recorded as queued.
  std::string add_queued();
  void set(PruneStatus status);
  std::optional<PruneStatus> find(const std::string& prune_id) const;

 private:
  mutable std::mutex mutex_;
  uint64_t next_id_ = 0;
  std::unordered_map<std::string, PruneStatus> by_id_;
  std::deque<std::string> order_;  // oldest first
};

}  // namespace se
