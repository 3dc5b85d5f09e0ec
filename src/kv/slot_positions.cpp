#include "kv/slot_positions.h"

#include "base/check.h"

namespace se {

void SlotPositions::append(int32_t first_position, int32_t num_tokens) {
  for (int32_t i = 0; i < num_tokens; ++i) shared_.push_back(first_position + i);
  for (size_t s = 0; s < own_.size(); ++s)
    if (has_own_[s])
      for (int32_t i = 0; i < num_tokens; ++i) own_[s].push_back(first_position + i);
}

void SlotPositions::attach(std::span<const int32_t> positions) {
  SE_CHECK(shared_.empty(), "slot positions: attach to a sequence that holds {} slots", shared_.size());
  shared_.assign(positions.begin(), positions.end());
}

void SlotPositions::keep(int32_t stream, std::span<const int32_t> kept_slots) {
  const auto s = static_cast<size_t>(stream);
  std::vector<int32_t> kept;
  kept.reserve(kept_slots.size());
  const std::span<const int32_t> current = of(stream);
  for (int32_t slot : kept_slots) {
    SE_CHECK(slot >= 0 && static_cast<size_t>(slot) < current.size(), "slot positions: stream {} has no slot {}",
             stream, slot);
    kept.push_back(current[static_cast<size_t>(slot)]);
  }
  own_[s] = std::move(kept);
  has_own_[s] = true;
}

void SlotPositions::move_last_into(int32_t stream, int32_t slot) {
  const auto s = static_cast<size_t>(stream);
  if (!has_own_[s]) {
    own_[s] = shared_;
    has_own_[s] = true;
  }
  std::vector<int32_t>& slots = own_[s];
  SE_CHECK(slot >= 0 && static_cast<size_t>(slot) < slots.size(), "slot positions: stream {} has no slot {}", stream,
           slot);
  slots[static_cast<size_t>(slot)] = slots.back();
  slots.pop_back();
}

void SlotPositions::drop_last(int32_t num_slots) {
  const auto n = static_cast<size_t>(num_slots);
  const auto drop = [n](std::vector<int32_t>& slots) {
    SE_CHECK(slots.size() >= n, "slot positions: dropping {} of {} slots", n, slots.size());
    slots.resize(slots.size() - n);
  };
  drop(shared_);
  for (size_t s = 0; s < own_.size(); ++s)
    if (has_own_[s]) drop(own_[s]);
}

}  // namespace se
