// ChainCacheIndex: the Chain Cache's bookkeeping for eviction methods. Per chain_id it keeps the state the
// chain's last finished turn left behind (a ChainState: the method's retained KV, holding page references, and
// its per-sequence metadata), the logical token prefix that state stands for with its xxh3 digest, and the
// fingerprint of the settings that made it (model, dtype, method, method config). A chain is either idle (its
// state is here) or in flight (a turn took the state out: the chain is pinned and cannot be reclaimed or
// resumed twice). Idle chains are reclaimed in LRU order of their last turn when pages are needed. With a host
// tier (the cache's second page pool, kv/page_table_transfer.h) a reclaimed chain's state moves there and the
// chain stays idle, resumable, in the host's own LRU; a full tier drops its least recently used chains to take
// it, where that makes room. Without a tier, or when the tier cannot hold the state, the chain is dropped. A dropped
// chain leaves a tombstone in a bounded FIFO so it answers kGone instead of kNotFound.
//
// Thread-safe (one mutex), so a request's chain can be checked and pinned on the submitting thread. Destroying a
// state releases its pages, so the calls that can (reclaim, drop of an idle chain, the destructor) belong to the
// thread that owns the pool (the engine thread); create, begin_turn, cancel_turn and
// the queries move states or read metadata only.
//
// Invariants (check_integrity): the two LRU lists hold exactly the idle chains, once each, the host's those
// whose state is on the host tier; the running totals of reclaimable (device) and host pages are what their
// states hold; every chain's digest is that of its token list; no live chain is tombstoned; the tombstones never
// exceed their bound.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"

namespace se {

// xxh3 of the token ids' bytes: what a chain's stored prefix is checked against.
uint64_t token_digest(std::span<const int32_t> tokens);

// A finished turn's retained state, opaque to the index (the sparse layer defines it).
class ChainState {
 public:
  virtual ~ChainState() = default;
  // Device pages the state holds references to (none while it is on the host tier).
  virtual int64_t num_held_pages() const = 0;
  // Moves the state's pages to the host tier (nothing to do when they are there): the state then holds no device
  // pages, and resuming it brings them back. kResourceExhausted while the tier lacks room; any other error means it
  // never can (no tier, or one too small). Nothing changes on error.
  virtual Status offload() { return unimplemented("this state has no host tier to move to"); }
  virtual bool is_offloaded() const { return false; }
  // Host tier pages the state holds (none unless offloaded).
  virtual int64_t num_host_pages() const { return 0; }
  // Host tier pages offload() lacks now: what it takes there beyond the tier's free pages (0 when they suffice, when
  // it is offloaded, or has no tier to go to). Every state says: one that can be offloaded and reports nothing
  // short would never make the tier give way for it.
  virtual int64_t num_host_pages_short() const = 0;
  // Free device pages resuming the state takes first (bringing it back from the host tier).
  virtual int64_t num_pages_to_restore() const { return 0; }
  // Device pages beyond those it holds (or restores) that appending `num_new_tokens` to every stream may take at
  // most, before any eviction; nullopt where the method's peak for the new tokens alone bounds them.
  virtual std::optional<int64_t> num_pages_to_extend(int64_t /*num_new_tokens*/) const { return std::nullopt; }
  // Tokens whose KV the state stands for (the absolute position of the next token); the chain's stored prefix
  // may hold more (a last sampled token not computed yet).
  virtual int32_t num_logical_tokens() const = 0;
};

struct ChainInfo {
  std::string chain_id;
  bool in_flight = false;
  int32_t num_prefix_tokens = 0;  // logical tokens the stored state stands for (0 while a first turn runs)
  uint64_t digest = 0;            // token_digest of those tokens
  int64_t num_held_pages = 0;     // device pages; 0 while in flight
  bool on_host = false;           // idle, its state on the host tier
  int64_t num_host_pages = 0;     // 0 unless on_host
};

class ChainCacheIndex final {
 public:
  explicit ChainCacheIndex(int32_t max_tombstones = 4096) : max_tombstones_(max_tombstones) {}
  ChainCacheIndex(const ChainCacheIndex&) = delete;
  ChainCacheIndex& operator=(const ChainCacheIndex&) = delete;

  // A new chain, in flight with no state (its first turn runs). kInvalidArgument if the id is live or
  // tombstoned.
  Status create(const std::string& chain_id, const std::string& fingerprint);
  // Starts a turn whose full logical context is `tokens`: takes the stored state out and pins the chain.
  // kNotFound (never existed), kGone (reclaimed), kConflict (a turn is in flight, the fingerprint differs, or
  // `tokens` does not strictly extend the stored prefix); on error nothing changed.
  Result<std::unique_ptr<ChainState>> begin_turn(const std::string& chain_id, const std::string& fingerprint,
                                                 std::span<const int32_t> tokens);
  // Ends an in-flight turn: the chain now holds `state` for the logical prefix `tokens` and becomes the most
  // recently used idle chain.
  void end_turn(const std::string& chain_id, std::vector<int32_t> tokens, std::unique_ptr<ChainState> state);
  // Gives back the state begin_turn took, unchanged (the turn did not run): the chain is idle again with its
  // previous prefix, as the most recently used.
  void cancel_turn(const std::string& chain_id, std::unique_ptr<ChainState> state);
  // Takes an idle chain's state out for work between turns (pruning it), with the logical prefix it stands for;
  // the chain is pinned as during a turn until cancel_turn gives the state back (or drop, when it is lost).
  // kNotFound, kGone, kConflict (a turn is in flight).
  struct IdleState {
    std::unique_ptr<ChainState> state;
    std::vector<int32_t> tokens;
  };
  Result<IdleState> take_idle(const std::string& chain_id);
  // Removes a chain (its turn failed or its state was lost) and tombstones it. Unknown ids are ignored.
  void drop(const std::string& chain_id);
  // Reclaims idle chains whose states hold device pages, least recently used first, until they held `num_pages`
  // pages or none is left: each moves to the host tier or is dropped (above). Returns the device pages freed.
  int64_t reclaim(int64_t num_pages);

  // Moves an idle chain's state to the host tier now, as reclaim would (the host's least recently used chains
  // dropped for room, the chain itself when it cannot go there). Unknown and busy chains are ignored.
  void park(const std::string& chain_id);
  // Moves a state the index does not hold (a preempted request's) to the host tier, the idle chains there giving way
  // as they do to a reclaimed chain's: when the tier lacks room, the least recently used are dropped only if together
  // they hold what is short, and only while each drop shortens it. offload()'s error when it still cannot go there.
  Status offload_state(ChainState& state);
  // Drops the idle chains on the host tier, least recently used first, while `short_by()` (what some caller lacks;
  // where running sequences live there too, their host pages) is positive and each drop shortens it: once a drop
  // gains nothing, what is missing is not the tier's room. `short_by` runs under the index's lock: it must not call
  // the index.
  void drop_host_chains_while_short(const std::function<int64_t()>& short_by);

  std::optional<ChainInfo> find(const std::string& chain_id) const;
  // The stored prefix of an idle chain (empty otherwise).
  std::vector<int32_t> prefix(const std::string& chain_id) const;
  int32_t num_chains() const;
  int32_t num_idle_chains() const;  // on either tier
  int32_t num_chains_on_host() const;
  // Host tier pages the idle chains hold (a running total, as num_reclaimable_pages): those on the host, and those
  // a chain still on the device kept there from a cache whose running sequences live in the tier.
  int64_t num_host_pages() const;
  // Pages held by idle chains: what reclaim() could give back. A running total (read every engine step), kept
  // where chains enter and leave the LRU; a state's pages do not change while it is idle.
  int64_t num_reclaimable_pages() const;

  // Ok, or the first violated invariant.
  Status check_integrity() const;

 private:
  struct Chain {
    std::string fingerprint;
    std::vector<int32_t> tokens;  // the logical prefix the state stands for
    uint64_t digest = 0;
    std::unique_ptr<ChainState> state;        // null while in flight
    std::list<std::string>::iterator lru_it;  // valid while idle, in the LRU of its state's tier
  };

  // Callers hold mutex_.
  // Lists an idle chain as the most recently used of its state's tier.
  void make_idle(const std::string& chain_id, Chain& chain);
  // Takes an idle chain out of its LRU (its state stays with it).
  void leave_lru(Chain& chain);
  // Moves an idle chain's state to the host tier (offload_making_room); false when it cannot go there (the chain is
  // then left out of every LRU, for the caller to drop).
  bool offload_locked(const std::string& chain_id, Chain& chain);
  // offload_state's work. Dropping chains that cannot make room would destroy idle state for nothing: an error other
  // than the tier's room (no tier, one too small for it) drops none, nor does a shortfall the host chains do not cover.
  Status offload_making_room(ChainState& state);
  // drop_host_chains_while_short's work.
  void drop_host_chains_locked(const std::function<int64_t()>& short_by);
  // Host tier pages the idle chains on the host hold (what dropping them all gives back).
  int64_t num_pages_of_host_chains() const;
  // offload_locked, or drops the chain when it cannot go there (`chain_id` must not be the map's own key).
  void park_locked(const std::string& chain_id, Chain& chain);
  void tombstone(const std::string& chain_id);
  void drop_locked(const std::string& chain_id);
  bool is_tombstoned(const std::string& chain_id) const { return tombstone_set_.count(chain_id) != 0; }

  mutable std::mutex mutex_;
  int32_t max_tombstones_;
  std::unordered_map<std::string, Chain> chains_;
  std::list<std::string> lru_;          // idle chains on the device, least recently used first
  std::list<std::string> host_lru_;     // idle chains on the host tier, least recently used first
  int64_t num_reclaimable_pages_ = 0;   // device pages the chains of lru_ hold
  int64_t num_host_pages_ = 0;          // host pages the idle chains hold
  std::deque<std::string> tombstones_;  // oldest first
  std::unordered_set<std::string> tombstone_set_;
};

}  // namespace se
