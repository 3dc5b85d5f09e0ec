// CacheManager: owns the KV state of every running sequence for one method: representation, layout, the
// position map (each sequence's logical length vs its streams' physical lengths), allocation, writes,
// eviction and freeing, and per-sequence snapshots. It builds the AttentionView attention reads and answers
// the scheduler's memory questions through the MemoryOracle. The part a method's hooks use is KvStreams
// (kv_streams.h, which also defines the names `seq`, `slot` and `slice`); the rest is the engine's.
// Engine thread only.
//
// Lifecycle of a sequence: open() (prefix reuse) -> per step reserve(n) before the forward, the forward
// (write, build_view, attention, method hooks, evict) -> on_computed() after it -> close(). Only reserve,
// evict, truncate, on_computed, restore and close mutate cache state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/attention_view.h"
#include "backend/ops.h"
#include "base/status.h"
#include "kv/kv_layout.h"
#include "kv/radix_cache.h"
#include "model/forward_batch.h"
#include "sparse/kv_streams.h"

namespace se {

// A sequence's cache state taken out of the cache (Chain Cache keeps these between turns). Holds page
// references until restored or destroyed: in the device pool, or on the cache's host tier once offloaded.
class SequenceSnapshot {
 public:
  virtual ~SequenceSnapshot() = default;
  virtual int32_t num_logical_tokens() const = 0;
  // Device pool pages it holds (none once offloaded).
  virtual int64_t num_held_pages() const = 0;
  // Moves its pages to the host tier (nothing to do when they are there), freeing its device pages; restore brings
  // them back. kUnimplemented without a host tier, kOutOfRange when the tier could never hold it,
  // kResourceExhausted while the tier lacks room; nothing changes on error.
  virtual Status offload() { return unimplemented("this cache keeps no host tier"); }
  virtual bool is_offloaded() const { return false; }
  // Host tier pages it holds (none unless offloaded, or taken from a cache whose running sequences live there too).
  virtual int64_t num_host_pages() const { return 0; }
  // Host tier pages offload() lacks now, beyond the tier's free ones (0 when they suffice, once offloaded, or
  // without a tier). Every snapshot says, as ChainState::num_host_pages_short.
  virtual int64_t num_host_pages_short() const = 0;
  // Free device pages restoring it takes (none unless offloaded).
  virtual int64_t num_pages_to_restore() const { return 0; }
  // Device pages beyond those it holds (or restores) that appending `num_new_tokens` to every stream may take at
  // most, before any eviction; nullopt where pages fill in token order, so that the method's peak for the new tokens
  // alone bounds them (a KIVI stream's window decides when its next groups fill, and never holds a new prompt whole).
  virtual std::optional<int64_t> num_pages_to_extend(int64_t /*num_new_tokens*/) const { return std::nullopt; }
};

class CacheManager : public KvStreams {
 public:
  // --- MemoryOracle answers ---
  // Pages the pool holds in all.
  virtual int64_t num_total_pages() const = 0;
  // Pages free in the pool right now.
  virtual int64_t num_free_pages() const = 0;
  // Pages available now: free in the pool plus what the prefix cache could give back.
  virtual int64_t num_available_pages() const = 0;
  // Pages that sequences and their snapshots hold in the pool now: in use, less what the prefix cache could give
  // back. Not total - available, which counts more than free pages where the host tier takes running sequences' pages.
  virtual int64_t num_used_pages() const = 0;
  // The host tier's pages in all and free (0 and 0 without one).
  virtual int64_t num_host_pages() const { return 0; }
  virtual int64_t num_free_host_pages() const { return 0; }
  // Whether running sequences live in the host tier too (their room counts its free pages): idle state kept there
  // then competes with them, and a preempted sequence is worth keeping there (SequenceSnapshot::offload) rather
  // than recomputed.
  virtual bool runs_on_host_tier() const { return false; }
  // Pages a sequence must newly take to compute `num_new_tokens` more tokens this step.
  virtual int64_t pages_to_reserve(int32_t seq, int32_t num_new_tokens) const = 0;
  // Pages the sequence holds now.
  virtual int64_t num_held_pages(int32_t seq) const = 0;
  // Ok when a sequence of at most `max_num_tokens` tokens that holds `peak_pages` pages at its peak could ever run
  // alone; else kResourceExhausted saying what is short. By default the pool must hold its peak.
  virtual Status check_can_ever_hold(int64_t peak_pages, int32_t /*max_num_tokens*/) const {
    if (peak_pages <= num_total_pages()) return Status::ok();
    return resource_exhausted("it holds {} pages at its peak, the pool {} pages of {} tokens per layer and head",
                              peak_pages, num_total_pages(), layout().page_size);
  }

  // --- lifecycle ---
  // Starts sequence `seq` on `prompt`; returns how many leading prompt tokens are already cached (reused, not
  // recomputed). The sequence then holds those tokens.
  virtual Result<int32_t> open(int32_t seq, std::span<const int32_t> prompt) = 0;
  // Makes room for `num_new_tokens` more tokens of `seq` (its next forward writes them). All or nothing:
  // kResourceExhausted leaves everything unchanged.
  virtual Status reserve(int32_t seq, int32_t num_new_tokens) = 0;
  // After a forward: `tokens` are the sequence's first `num_computed` token ids, now in the cache.
  virtual void on_computed(int32_t seq, std::span<const int32_t> tokens, int32_t num_computed) = 0;
  // Releases the sequence (what it computed may stay behind in the prefix cache).
  virtual void close(int32_t seq) = 0;
  // Takes the sequence's state out of the cache (the sequence is closed) / opens `seq` on a snapshot (an offloaded
  // one's pages come back into the device pool first: kResourceExhausted when it lacks num_pages_to_restore()
  // free pages, the prefix cache's evictable ones included).
  virtual std::unique_ptr<SequenceSnapshot> snapshot(int32_t seq) = 0;
  virtual Status restore(int32_t seq, std::unique_ptr<SequenceSnapshot> snapshot) = 0;

  // --- what the step writes and attention reads ---
  // Layer `layer` of the batch's sequences, after reserve(): each sequence's new rows are the last slots.
  virtual AttentionView build_view(int layer, const ForwardBatch& batch) = 0;
  // Writes the batch's new K/V rows (k, v [T, Hkv, D]) into `view`, layer `layer`'s build_view (or its device
  // mirror); a quantizing store encodes them on the way in (and may first fix its scales from them).
  virtual void write(int /*layer*/, const AttentionView& view, TensorView k, TensorView v) { write_kv(view, k, v); }
  // Changes whenever a page already listed in one of `seq`'s views may have changed (anything but pages added at
  // the ends of its streams); never repeats, even across sequences, so a copy of the views' page lists (the
  // device mirror) can tell which of its lists still hold and only add the new pages.
  virtual uint64_t table_epoch(int32_t seq) const = 0;
  // Drops the sequence's newest tokens (e.g. a transient pass): back to `num_tokens` logical tokens, removing
  // the last (logical length - num_tokens) tokens of every stream, whose pages return to the pool now. Those
  // tokens must have been appended after any eviction of the stream. kOutOfRange / kFailedPrecondition leave
  // everything unchanged (a stream holds fewer tokens, or the cut reaches into prefix-cached blocks).
  virtual Status truncate(int32_t seq, int32_t num_tokens) {
    return unimplemented("this cache cannot truncate sequence {} to {} tokens", seq, num_tokens);
  }

  // --- prefix pruning (kv/prefix_prune.h): caches without a radix prefix cache answer kUnimplemented ---
  // What the prefix cache holds for `tokens` (every whole block may match); changes nothing.
  virtual Result<RadixCache::PrefixMatch> inspect_prefix(std::span<const int32_t> tokens) const {
    return unimplemented("this cache keeps no radix prefix cache to inspect ({} tokens)", tokens.size());
  }
  // Ok when blocks `blocks` of `tokens` may be pruned now; kUnavailable while a block is in use (a running
  // request holds it), kFailedPrecondition when they can never be (radix_cache.h: prunable_nodes).
  virtual Status check_prunable(std::span<const int32_t> tokens, RadixCache::BlockRange blocks) const {
    return unimplemented("this cache keeps no radix prefix cache to prune ({} tokens, blocks [{}, {}))",
                         tokens.size(), blocks.first_block, blocks.end_block);
  }
  // Called per layer after pruning rewrote pages, or after pages came back from the host tier under new ids:
  // `view` is one sequence whose new rows are those pages' tokens (what methods with per-page metadata refresh).
  using PagesRewrittenFn = std::function<void(int layer, const AttentionView& view)>;
  // Calls `pages_retrieved` per layer over the pages of `seq`'s cached prefix that open() brought back from the
  // host tier (radix blocks kept there); nothing when it brought none.
  virtual void visit_retrieved_pages(int32_t /*seq*/, const PagesRewrittenFn& /*pages_retrieved*/) {}
  // Prunes blocks `blocks` of `tokens` (check_prunable ok) to the KV of `kept_positions` (ascending absolute
  // positions inside the blocks, a whole number of pages): every stream's kept KV moves, in order, into the
  // pages of the first blocks; the rest return to the pool. Returns the pages freed.
  virtual Result<int32_t> prune_prefix(std::span<const int32_t> tokens, RadixCache::BlockRange blocks,
                                       std::span<const int32_t> kept_positions,
                                       const PagesRewrittenFn& /*pages_rewritten*/) {
    return unimplemented("this cache keeps no radix prefix cache to prune ({} tokens, blocks [{}, {}), {} kept)",
                         tokens.size(), blocks.first_block, blocks.end_block, kept_positions.size());
  }

  // Metrics of the prefix cache: prompt tokens looked up and found (zeros without one).
  struct PrefixCacheCounters {
    int64_t query_tokens = 0;
    int64_t hit_tokens = 0;
  };
  virtual PrefixCacheCounters prefix_cache_counters() const { return {}; }

  // Ok, or the first broken invariant of the pool, tables and caches.
  virtual Status check_integrity() const = 0;

 protected:
  explicit CacheManager(const KvLayout& layout) : KvStreams(layout) {}
};

}  // namespace se
