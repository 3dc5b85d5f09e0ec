// Prefix-pruning jobs (kv/prefix_prune.h) as the engine runs them: a PruneRequest names token ranges of a
// cached prefix (the radix cache's, or a Chain Cache chain's), a policy and how many positions each range keeps;
// the engine thread runs it between steps (run_prune, run_chain_prune) and records the outcome in a
// PruneStatusBoard that HTTP threads read. A prune either changes every range it can or, when what it would
// change is in use by a running request, nothing ("blocked").
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/chain_cache.h"
#include "kv/prefix_prune.h"
#include "model/model.h"
#include "sparse/method_environment.h"
#include "sparse/method_runtime.h"
#include "sparse/prune/prune_policy.h"
#include "sparse/sparse_controller.h"

namespace se {

struct PruneRequest {
  // The radix cache's prefix to prune, or with chain_id (optional there) the start of the chain's prefix.
  std::vector<int32_t> token_ids;
  std::string chain_id;            // prune this Chain Cache chain's retained state (run_chain_prune)
  std::vector<TokenRange> ranges;  // ascending, non-overlapping, inside token_ids (a chain: inside its prefix)
  int32_t keep_tokens = 0;         // positions each range keeps (before rounding up to whole pages)
  PrunePolicy policy = PrunePolicy::kSnapKvGlobal;
  int32_t window = 32;  // snapkv_global's observation window
};

// Ok, or kInvalidArgument naming what is wrong (empty tokens without a chain, no ranges, a range outside the
// tokens, empty, overlapping or out of order, keep_tokens outside [0, range size], window < 1). A chain's ranges
// are checked against its prefix again when the prune runs.
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

// Runs `request` (chain_id set) against that Chain Cache chain on the engine thread: a chain with a turn in
// flight is blocked (nothing changed); otherwise the chain is taken out (pinned), its prefix scored by the policy
// in a scratch sequence, and its retained state opened in `controller` under a sequence id of its own, where
// every stream drops the slots of the ranges' positions the policy does not keep: the resident set becomes
// (R \ T) ∪ (R ∩ I), token by token. On a sliding-window layer the stream stays a contiguous tail
// (sliding_window_tail.h): it drops its slots older than both the range's end and the layer's window, which no
// query reads again. The method compacts its per-slot metadata alike (on_stream_compacted), and the state goes
// back to the chain as its most recently used.
PruneStatus run_chain_prune(const PruneRequest& request, ChainCacheIndex& chains, SparseController& controller,
                            const Model& model, const MethodEnvironment& environment);

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
