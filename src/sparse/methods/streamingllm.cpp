#include "sparse/methods/streamingllm.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"
#include "sparse/budget_eviction.h"
#include "sparse/kivi_cache_manager.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> StreamingLlmMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("streamingllm", config));
  SE_ASSIGN_OR_RETURN(const int budget, reader.get_int("budget", 2048, 1, 1 << 30));
  SE_ASSIGN_OR_RETURN(const int num_sink_tokens, reader.get_int("sink_tokens", 4, 0, 1 << 30));
  SE_RETURN_IF_ERROR(reader.finish());
  if (num_sink_tokens >= budget)
    return invalid_argument("streamingllm: 'sink_tokens' = {} must be below 'budget' = {} (no room for recent tokens)",
                            num_sink_tokens, budget);
  return std::unique_ptr<MethodRuntime>(new StreamingLlmMethod(reader.resolved(), budget, num_sink_tokens));
}

StreamingLlmMethod::StreamingLlmMethod(nlohmann::ordered_json config, int32_t budget, int32_t num_sink_tokens)
    : MethodRuntime("streamingllm", std::move(config)), budget_(budget), num_sink_tokens_(num_sink_tokens) {
  traits_.family = MethodFamily::kEviction;
  traits_.keeps_full_history = false;
  traits_.ops = {OpId::kCompactKv, OpId::kMoveKvRows};
  traits_.position_only = true;
  traits_.tensor_parallel = true;        // every stream keeps the same positions
  traits_.static_decode_forward = true;  // it evicts in finish_step, outside the forward
  traits_.prefix_mode = PrefixMode::kChain;
  traits_.prefill_policy = PrefillPolicy::kEvictDuring;
  traits_.evicts_sealed_groups = true;
}

int64_t StreamingLlmMethod::resident_pages(const KvLayout& layout, int32_t /*num_prefill_tokens*/,
                                           int32_t num_tokens) const {
  if (layout.kivi())
    return KiviCacheManager::sealed_group_eviction_pages(layout, num_tokens, max_kept_in_groups(layout));
  return budget_resident_pages(layout, num_tokens, budget_);
}

int32_t StreamingLlmMethod::max_kept_in_groups(const KvLayout& layout) const {
  // After a step a stream holds its sinks' groups, then every token from the group boundary at or below the first one
  // it must keep: the oldest recent token, or the oldest value still in the window where that lies further back.
  const int32_t group = layout.page_size;
  return sinks_end(group) + std::max(budget_ - num_sink_tokens_, layout.kivi_residual) + group - 1;
}

void StreamingLlmMethod::drop_sealed_groups(StepContext& ctx, const SequenceSlice& slice, int32_t group_size) {
  const KvLayout& layout = ctx.cache.layout();
  scratch_.kept.resize(static_cast<size_t>(layout.num_streams()));
  scratch_.evictions.clear();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    // A sliding-window layer keeps a contiguous tail (sliding_window_tail.h): no sinks there.
    const int32_t window = ctx.sliding_window(layer);
    const int32_t kept_sinks_end = window > 0 ? 0 : sinks_end(group_size);
    const int32_t recent = window > 0 ? std::min(budget_, window - 1) : budget_ - num_sink_tokens_;
    for (int head = 0; head < layout.num_kv_heads; ++head) {
      const int32_t len = ctx.cache.stream_length(slice.seq, layer, head);
      if (len <= budget_) continue;
      // The groups in [kept_sinks_end, drop_end) hold only tokens older than the recent ones, and are sealed.
      const int32_t sealed_end = ctx.cache.sealed_groups(slice.seq, layer, head).count * group_size;
      const int32_t drop_end = std::min(len - recent, sealed_end) / group_size * group_size;
      if (drop_end <= kept_sinks_end) continue;
      std::vector<int32_t>& kept = scratch_.kept[static_cast<size_t>(layout.stream(layer, head))];
      kept.resize(static_cast<size_t>(kept_sinks_end + len - drop_end));
      std::iota(kept.begin(), kept.begin() + kept_sinks_end, 0);
      std::iota(kept.begin() + kept_sinks_end, kept.end(), drop_end);
      scratch_.evictions.push_back({layer, head, kept});
    }
  }
  if (scratch_.evictions.empty()) return;
  const Status dropped = ctx.cache.evict_streams(slice.seq, scratch_.evictions);
  SE_CHECK(dropped.is_ok(), "streamingllm: {}", dropped.to_string());
}

int32_t StreamingLlmMethod::oldest_window_slot(std::span<const int32_t> positions) {
  order_.assign(positions.begin(), positions.end());
  std::nth_element(order_.begin(), order_.begin() + num_sink_tokens_, order_.end());
  const int32_t oldest = order_[static_cast<size_t>(num_sink_tokens_)];
  return static_cast<int32_t>(std::find(positions.begin(), positions.end(), oldest) - positions.begin());
}

void StreamingLlmMethod::keep_by_position(std::span<const int32_t> positions, std::vector<int32_t>& kept) {
  const auto len = static_cast<int32_t>(positions.size());
  order_.resize(positions.size());
  std::iota(order_.begin(), order_.end(), 0);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return positions[a] < positions[b]; });
  kept.assign(order_.begin(), order_.begin() + num_sink_tokens_);
  kept.insert(kept.end(), order_.begin() + (len - (budget_ - num_sink_tokens_)), order_.end());
  std::sort(kept.begin(), kept.end());
}

void StreamingLlmMethod::finish_step(StepContext& ctx) {
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    if (const int32_t group = ctx.cache.sealed_groups(slice.seq, 0, 0).group_size; group > 0) {
      drop_sealed_groups(ctx, slice, group);
      continue;
    }
    evict_to_budget(
        ctx, slice, budget_, "streamingllm", scratch_,
        [&](std::span<KvStreams::SlotEviction> streams) {
          // The full-attention streams share their position map, so one search serves them all.
          int32_t shared_slot = -1, shared_position = -1;
          for (KvStreams::SlotEviction& e : streams) {
            const std::span<const int32_t> positions = ctx.cache.slot_positions(slice.seq, e.layer, e.kv_head);
            if (shared_slot < 0 || positions[static_cast<size_t>(shared_slot)] != shared_position) {
              shared_slot = oldest_window_slot(positions);
              shared_position = positions[static_cast<size_t>(shared_slot)];
            }
            e.slot = shared_slot;
          }
        },
        [&](int /*layer*/, int /*kv_head*/, std::span<const int32_t> positions, std::vector<int32_t>& kept) {
          keep_by_position(positions, kept);
        });
  }
}

}  // namespace se
