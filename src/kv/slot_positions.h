// SlotPositions: a sequence's position map, the absolute token position each physical slot of each stream
// (layer, KV head) holds. Eviction compacts a stream to the slots it keeps, so after it slot i no longer holds
// position i; Chain Cache pruning needs to find a stream's slots inside a token range [L, R) again. Kept beside
// the sequence's PageTable by its cache manager, which moves both together.
//
// Representation: the slots of streams that were never compacted hold the same positions (appends reach every
// stream alike), so they share one list; a stream gets a list of its own the first time it is compacted. A
// full-history sequence thus costs 4 bytes per token, an eviction method's 4 bytes per retained slot.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace se {

class SlotPositions final {
 public:
  explicit SlotPositions(int32_t num_streams = 0)
      : own_(static_cast<size_t>(num_streams)), has_own_(static_cast<size_t>(num_streams), false) {}

  int32_t num_streams() const { return static_cast<int32_t>(own_.size()); }
  // The positions of stream `stream`'s slots, slot order (ascending for every sequence built by the calls
  // below with ascending arguments and without move_last_into).
  std::span<const int32_t> of(int32_t stream) const {
    return has_own_[static_cast<size_t>(stream)] ? own_[static_cast<size_t>(stream)] : shared_;
  }

  // Every stream gains `num_tokens` slots holding positions first_position, first_position + 1, ...
  void append(int32_t first_position, int32_t num_tokens);
  // Every stream starts on an attached prefix whose slots hold `positions` (a radix prefix, pruned segments
  // leaving gaps). Precondition: no slot yet.
  void attach(std::span<const int32_t> positions);
  // Stream `stream` keeps only slots `kept_slots` (ascending), in that order.
  void keep(int32_t stream, std::span<const int32_t> kept_slots);
  // Stream `stream`'s last slot replaces slot `slot` (whose position goes); the stream is one slot shorter.
  void move_last_into(int32_t stream, int32_t slot);
  // Every stream drops its last `num_slots` slots. Precondition: each holds at least that many.
  void drop_last(int32_t num_slots);

 private:
  std::vector<int32_t> shared_;              // slots of the streams without a list of their own
  std::vector<std::vector<int32_t>> own_;    // [stream]: a compacted stream's slots
  std::vector<bool> has_own_;                // [stream]
};

}  // namespace se
