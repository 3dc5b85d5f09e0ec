// One sequence's eviction down to a per-stream budget, as the methods that evict after every step do
// (StreamingLLM, H2O): every stream that holds more than `budget` tokens keeps, on a sliding-window layer,
// the tail the layer can still see (sliding_window_tail.h), and otherwise the ascending slots the method's
// choice writes; all of the sequence's streams are evicted in one CacheManager call.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "sparse/method_runtime.h"
#include "sparse/sliding_window_tail.h"

namespace se {

// Scratch kept across steps by the method: one kept list per stream and the call's eviction list.
struct BudgetEvictionScratch {
  std::vector<std::vector<int32_t>> kept;
  std::vector<CacheManager::StreamEviction> evictions;
};

// choose_kept(layer, kv_head, len, kept) fills `kept` for a full-attention stream of len > budget tokens. Returns
// the evictions made (each one's kept list lives in `scratch` until the next call).
template <typename ChooseKept>
std::span<const CacheManager::StreamEviction> evict_to_budget(StepContext& ctx, int32_t seq, int32_t budget,
                                                              std::string_view method,
                                                              BudgetEvictionScratch& scratch,
                                                              ChooseKept&& choose_kept) {
  const KvLayout& layout = ctx.cache.layout();
  scratch.kept.resize(static_cast<size_t>(layout.num_streams()));
  scratch.evictions.clear();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (int head = 0; head < layout.num_kv_heads; ++head) {
      const int32_t len = ctx.cache.stream_length(seq, layer, head);
      if (len <= budget) continue;
      std::vector<int32_t>& kept = scratch.kept[static_cast<size_t>(layout.stream(layer, head))];
      if (const int32_t window = ctx.sliding_window(layer); window > 0) {
        keep_sliding_window_tail(len, window, budget, kept);
      } else {
        choose_kept(layer, head, len, kept);
      }
      scratch.evictions.push_back({layer, head, kept});
    }
  }
  const Status s = ctx.cache.evict_streams(seq, scratch.evictions);
  SE_CHECK(s.is_ok(), "{}: {}", method, s.to_string());
  return scratch.evictions;
}

}  // namespace se
