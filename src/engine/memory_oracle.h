// MemoryOracle: the scheduler's only view of KV memory. It turns the active method's and its CacheManager's
// answers into the scheduling decisions: can a request ever fit, admit it (start its cache state, reusing a cached
// prefix), reserve room for a step, release it. Under tensor parallelism every rank keeps the KV of its own heads in a
// cache of its own, with a method instance of its own: the oracle asks each rank, admits and reserves only what every
// rank can hold, and applies each decision to every rank, so their caches change in step. Engine thread only (the
// ranks' caches are touched between steps, while their workers wait), except can_ever_fit (pure).
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "engine/request.h"
#include "sparse/sparse_controller.h"

namespace se {

class MemoryOracle {
 public:
  // `ranks`: every tensor-parallel rank's controller, rank 0's first. `chains` (may be null: no Chain Cache) gives
  // back idle chains' device pages when a reservation is short (moving them to the cache's host tier when it has
  // one).
  explicit MemoryOracle(std::vector<SparseController*> ranks, ChainCacheIndex* chains = nullptr)
      : ranks_(std::move(ranks)), chains_(chains) {}
  explicit MemoryOracle(SparseController& controller, ChainCacheIndex* chains = nullptr)
      : MemoryOracle(std::vector<SparseController*>{&controller}, chains) {}

  // Whether a request of this size fits in the whole pool at its peak, on every rank (where running sequences live
  // partly on the host tier: the device holds its working set, the two pools the rest); kResourceExhausted saying
  // what is short. Pure: safe from any thread.
  Status check_can_ever_fit(int32_t num_prompt_tokens, int32_t max_new_tokens) const {
    for (const SparseController* rank : ranks_)
      SE_RETURN_IF_ERROR(rank->cache().check_can_ever_hold(rank->peak_pages(num_prompt_tokens, max_new_tokens),
                                                           num_prompt_tokens + max_new_tokens));
    return Status::ok();
  }
  bool can_ever_fit(int32_t num_prompt_tokens, int32_t max_new_tokens) const {
    return check_can_ever_fit(num_prompt_tokens, max_new_tokens).is_ok();
  }
  // Starts the request's cache state on all its known tokens (a resumed request recomputes its outputs too)
  // and sets num_computed_tokens / num_cached_tokens from the prefix cache, or from the chain state the request
  // carries (restored into the new sequence); a request with a kept state (preempt) resumes that, its progress
  // unchanged. A chain state on the host tier comes back into device pages: when
  // they stay short after reclaiming idle chains, kResourceExhausted and the request keeps its state.
  Status admit(Request& request);
  // A new step's scheduling starts: no room is held back for transient passes yet.
  void begin_step() { num_headroom_pages_ = 0; }
  // Room for `num_tokens` more tokens of a request this step, reclaiming idle chains (LRU) when the pool is
  // short; false (nothing else changed) when memory stays short.
  // When these tokens complete the request's prefill, the room its method's transient passes take right
  // after (SparseController::transient_pages) must stay free too, and stays held back from the step's later
  // reservations (the passes of several sequences run one after another, so the largest one counts).
  bool try_reserve(Request& request, int32_t num_tokens);
  // After the step's forward: the request's first num_computed_tokens tokens are in the cache.
  void commit(Request& request);
  // Ends the request's cache state (finish, abort, or a preemption preempt() does not keep); nothing of it counts as
  // computed any more. A chain request that computed nothing past its restored state takes that state back (it is
  // admitted again later; where running sequences live in the host tier the state goes back there, and when the
  // tier cannot take it, it is lost and the turn rebuilds it); one that did loses it and is marked rebuilt.
  void release(Request& request);
  // Ends the cache state of a request the scheduler puts back (preempted, or admitted without room to run). Where
  // running sequences live in the host tier (CacheManager::runs_on_host_tier, one rank), one that computed tokens
  // keeps its state parked there (SequenceSnapshot::offload) and its next admission resumes it, as if it had never
  // left: a recomputed one would prefill densely what it decoded through its method's selection. When the tier
  // lacks room, and elsewhere, it is released (and recomputes its tokens).
  void preempt(Request& request);
  // Ends the request's cache state by retaining it for Chain Cache (the request's seq is released): a
  // RetainedSequence, or with several ranks a RetainedRanks of one per rank.
  std::unique_ptr<ChainState> retain(Request& request);

  // The same for a turn resumed on a retained state that holds (or, on the host tier, takes back) `num_held_pages`:
  // its new tokens are prefilled on top of it, so the state plus their peak must fit, or, where the state bounds
  // them itself (ChainState::num_pages_to_extend), plus the `num_extension_pages` its streams may grow by. Pure.
  bool can_ever_fit_resumed(int64_t num_held_pages, std::optional<int64_t> num_extension_pages, int32_t num_new_tokens,
                            int32_t max_new_tokens) const {
    for (const SparseController* rank : ranks_)
      if (num_held_pages + num_extension_pages.value_or(rank->peak_pages(num_new_tokens, max_new_tokens)) >
          rank->cache().num_total_pages())
        return false;
    return true;
  }
  // Whether `candidate` and every request of `running` fit in the pool together at their peak lengths, on every rank:
  // a request's peak is its method's peak_pages for the prompt its prefill computes (at its next admission, for one
  // not admitted) and the tokens its max_tokens still allows after that prompt. Shared prefix pages count once per
  // request, so the answer errs toward no. Pure.
  bool fits_at_peak(std::span<Request* const> running, const Request& candidate) const;
  int64_t num_total_pages() const { return lead().num_total_pages(); }
  // The fewest pages any rank has available.
  int64_t num_available_pages() const;

 private:
  const CacheManager& lead() const { return ranks_[0]->cache(); }
  // Whether every rank has `num_pages[r]` device pages available, after reclaiming idle chains if one had not.
  bool make_room(const std::vector<int64_t>& num_pages);
  // The same number of pages on every rank.
  bool make_room(int64_t num_pages) { return make_room(std::vector<int64_t>(ranks_.size(), num_pages)); }
  // Opens `seq` on every rank, on the request's retained state or, where there is none or it cannot be resumed on
  // every rank, on its tokens; returns the tokens it starts with. On error no rank holds `seq`.
  Result<int32_t> open_on_every_rank(int32_t seq, Request& request);
  // Runs `open` for each rank in order; on the first error closes `seq` on the ranks that opened it.
  Result<int32_t> on_every_rank(int32_t seq, const Request& request,
                                const std::function<Result<int32_t>(size_t rank)>& open);
  // Closes `seq` on ranks [0, end).
  void close_on_ranks(int32_t seq, size_t end);
  std::unique_ptr<ChainState> retain_on_every_rank(int32_t seq);
  // Moves a request's state to the host tier, idle chains there giving way (ChainCacheIndex::offload_state).
  Status park_on_host(ChainState& state);

  std::vector<SparseController*> ranks_;
  ChainCacheIndex* chains_;
  int32_t next_seq_ = 0;
  int64_t num_headroom_pages_ = 0;  // kept free this step for transient passes
};

}  // namespace se
