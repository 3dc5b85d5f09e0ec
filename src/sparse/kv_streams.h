// KvStreams: what a sparse method's hooks read and change of the KV its CacheManager keeps (LayerContext::cache,
// StepContext::cache): each sequence's streams (one per layer and KV head), the position map saying which absolute
// position each slot of a stream holds, views of one sequence for work between forwards, and physical eviction.
// The engine's side of the cache (allocation, the sequence lifecycle, MemoryOracle answers, writes of the step's
// new rows, prefix pruning) is CacheManager's, which derives from this; hooks never see it.
//
// Names: `seq` is a sequence id (the engine hands each running request one and reuses it after the request ends);
// a stream's `slot` is an index into that stream's tokens as stored; a method hook's `slice` is a sequence's index
// in the step's batch (ForwardBatch::sequences). Engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/attention_view.h"
#include "base/status.h"
#include "kv/kv_layout.h"

namespace se {

class KvStreams {
 public:
  virtual ~KvStreams() = default;
  const KvLayout& layout() const { return layout_; }

  // Layer `layer` of one sequence with no new rows (q_indptr = {0, 0}), for work between forwards.
  virtual AttentionView build_sequence_view(int32_t seq, int layer) = 0;
  // Tokens of `seq` ever appended (the absolute position of its next token).
  virtual int32_t num_logical_tokens(int32_t seq) const = 0;
  // The position map: the absolute position each slot of stream (layer, kv_head) of `seq` holds, slot order.
  // Valid until the sequence next changes.
  virtual std::span<const int32_t> slot_positions(int32_t seq, int layer, int kv_head) const = 0;
  // The stream's physical length: one position per slot.
  int32_t stream_length(int32_t seq, int layer, int kv_head) const {
    return static_cast<int32_t>(slot_positions(seq, layer, kv_head).size());
  }
  // Physical eviction: each listed stream (layer, kv_head) of `seq` keeps only the tokens at its ascending
  // indices `kept`, compacted to the front of its pages in this order; the pages no longer needed return to the
  // pool now. The logical length is unchanged, so new tokens keep their absolute positions. Every stream is
  // checked before any changes (an error leaves the sequence as it was); the moves then run as one batch, which
  // is what makes evicting every stream at every decode step affordable on the GPU. A store that quantizes tokens in
  // groups takes only what sealed_groups allows of a stream it has quantized (kFailedPrecondition otherwise).
  struct StreamEviction {
    int layer = 0;
    int kv_head = 0;
    std::span<const int32_t> kept;
  };
  virtual Status evict_streams(int32_t seq, std::span<const StreamEviction> streams) = 0;
  // Whether evict_streams may drop any tokens of `seq` now: a store that quantized some of them into groups (KIVI)
  // cannot take single tokens out of a group, and a method then leaves the sequence as it is (or drops whole sealed
  // groups, below).
  virtual bool can_evict_streams(int32_t /*seq*/) const { return true; }
  // A store that quantizes tokens in groups sharing scales (KIVI's key groups) drops a group only whole, and only
  // once every key and value in it is quantized (sealed): its page then leaves, and no row moves. Stream (layer,
  // kv_head) of `seq` keeps its groups in slot order, group g in slots [g * group_size, (g + 1) * group_size); the
  // first `count` are sealed, counting what the step's pending flush seals. evict_streams takes a kept list that
  // leaves out whole sealed groups only. A store without groups answers {0, 0}: it drops any slot.
  struct SealedGroups {
    int32_t group_size = 0;
    int32_t count = 0;
  };
  virtual SealedGroups sealed_groups(int32_t /*seq*/, int /*layer*/, int /*kv_head*/) const { return {}; }
  Status evict(int32_t seq, int layer, int kv_head, const std::vector<int32_t>& kept) {
    const StreamEviction stream{layer, kv_head, kept};
    return evict_streams(seq, {&stream, 1});
  }
  // Physical eviction of one token per listed stream (layer, kv_head) of `seq`: the token in slot `slot` goes and
  // the stream's last slot moves into its place, so the stream is one slot shorter and a page may return to the
  // pool. One row moves per stream whatever its length (evict_streams moves every kept slot after the first
  // evicted one), which is what evicting one token per stream every decode step needs. Slot order then no longer
  // follows position order: slot_positions tells which slot holds which position. Every stream is checked before
  // any changes (an error leaves the sequence as it was).
  struct SlotEviction {
    int layer = 0;
    int kv_head = 0;
    int32_t slot = 0;
  };
  virtual Status evict_slots(int32_t seq, std::span<const SlotEviction> streams) = 0;

 protected:
  explicit KvStreams(const KvLayout& layout) : layout_(layout) {}

 private:
  KvLayout layout_;
};

}  // namespace se
