// One sequence's eviction down to a per-stream budget, as the methods that evict after every step do
// (PrefillPolicy::kEvictDuring). Every stream that holds more than `budget` tokens keeps, on a sliding-window layer,
// the tail the layer can still see (sliding_window_tail.h); a full-attention stream one token over after a one-token
// step (a decode step) loses the one slot the method names, refilled by its newest token (KvStreams::evict_slots:
// one row moves, so slot order drifts from position order); any other keeps the ascending slots the method's choice
// writes. All of the sequence's streams are evicted in two KvStreams calls.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "sparse/method_runtime.h"
#include "sparse/sliding_window_tail.h"

namespace se {

// Pages a sequence of num_tokens holds under evict_to_budget, as the memory model of its method: every stream keeps
// min(num_tokens, budget) tokens, and once over a budget on a page boundary also the page a one-token step opens,
// which the eviction keeps as the stream's spare for the next step (PageTable::drop_last_slot). So the count is the
// peak of a decode step; after a compacting prefill chunk the sequence holds one page a stream fewer.
inline int64_t budget_resident_pages(const KvLayout& layout, int32_t num_tokens, int32_t budget) {
  const bool spare = num_tokens > budget && budget % layout.page_size == 0;
  return layout.pages_for_tokens(std::min(num_tokens, budget)) + (spare ? layout.num_streams() : 0);
}

// Scratch kept across steps by the method: one kept list per stream and the call's evictions.
struct BudgetEvictionScratch {
  std::vector<std::vector<int32_t>> kept;
  std::vector<KvStreams::StreamEviction> evictions;
  std::vector<KvStreams::SlotEviction> slot_evictions;
};

// What one call evicted (each kept list lives in the scratch until the next call).
struct BudgetEvictions {
  std::span<const KvStreams::SlotEviction> slots;      // one token each, refilled by the stream's last
  std::span<const KvStreams::StreamEviction> streams;  // compacted to their kept slots
};

// For sequence `slice` of the step: choose_evicted(streams) sets the slot each listed full-attention stream
// loses, for the streams one token over the budget after a one-token step (a decode step), all of them in one call
// so a method may spread them over cores; choose_kept(layer, kv_head, positions, kept) fills `kept` for the other
// full-attention streams over the budget, `positions` being the stream's position map
// (KvStreams::slot_positions). A prefill chunk thus always compacts, keeping slot order in prompt order.
template <typename ChooseEvicted, typename ChooseKept>
BudgetEvictions evict_to_budget(StepContext& ctx, const SequenceSlice& slice, int32_t budget, std::string_view method,
                                BudgetEvictionScratch& scratch, ChooseEvicted&& choose_evicted,
                                ChooseKept&& choose_kept) {
  const int32_t seq = slice.seq;
  const KvLayout& layout = ctx.cache.layout();
  scratch.kept.resize(static_cast<size_t>(layout.num_streams()));
  scratch.evictions.clear();
  scratch.slot_evictions.clear();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (int head = 0; head < layout.num_kv_heads; ++head) {
      const int32_t len = ctx.cache.stream_length(seq, layer, head);
      if (len <= budget) continue;
      std::vector<int32_t>& kept = scratch.kept[static_cast<size_t>(layout.stream(layer, head))];
      if (const int32_t window = ctx.sliding_window(layer); window > 0) {
        keep_sliding_window_tail(len, window, budget, kept);
      } else if (slice.num_tokens == 1 && len == budget + 1) {
        scratch.slot_evictions.push_back({layer, head, -1});
        continue;
      } else {
        choose_kept(layer, head, ctx.cache.slot_positions(seq, layer, head), kept);
      }
      scratch.evictions.push_back({layer, head, kept});
    }
  }
  choose_evicted(std::span<KvStreams::SlotEviction>(scratch.slot_evictions));
  const Status refilled = ctx.cache.evict_slots(seq, scratch.slot_evictions);
  SE_CHECK(refilled.is_ok(), "{}: {}", method, refilled.to_string());
  const Status compacted = ctx.cache.evict_streams(seq, scratch.evictions);
  SE_CHECK(compacted.is_ok(), "{}: {}", method, compacted.to_string());
  return {scratch.slot_evictions, scratch.evictions};
}

}  // namespace se
