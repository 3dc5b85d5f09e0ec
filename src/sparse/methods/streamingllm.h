// streamingllm: attention sinks plus a sliding window (mit-han-lab/streaming-llm `StartRecentKVCache`).
// Every (layer, KV head) stream of a sequence keeps its first `sink_tokens` tokens and its most recent
// `budget - sink_tokens` tokens; everything in between is physically evicted. The rule is the same for all
// layers and heads and needs no scores. Stateless across steps: the kept set is a function of the positions the
// stream holds, so nothing is kept per sequence. Engine thread only.
//
// When it evicts: after every step (finish_step), prefill chunks and decode tokens alike, each stream longer than
// `budget` is compacted to sinks + the last (budget - sinks) tokens. This is the reference's
// `kv_cache(past)` hook, which eval_long_ppl calls after each forward. It is NOT its `evict_for_space(past, n)`
// (run_streaming_llama), which evicts *before* a step of n tokens down to sinks + the last (recent - n), so that
// the step itself attends over exactly `budget` tokens. NOTE: here a step of n tokens attends densely (causally)
// over the up-to-`budget` resident tokens plus its own n tokens: a decode token sees budget + 1 keys instead of
// budget, and a prefill chunk's queries see the whole chunk (the reference would first drop n more old tokens).
// The resident set after each step is exactly the kv_cache hook's; a step's transient peak is budget + n tokens.
//
// Layout: a full-attention stream one token over the budget (every decode step) evicts its oldest non-sink token
// by moving its newest into that slot (KvStreams::evict_slots): the recent window is a ring in slot order,
// and a step moves one row per stream instead of shifting the whole window down. Which slot that is comes from
// the position map, found once per sequence: the full-attention streams of a sequence hold the same positions in
// the same slots, since this rule and every other change of the cache (appends, chain pruning) treat them alike;
// a stream whose slot does not hold that position finds its own. Longer excesses (prefill chunks) keep the sinks
// and the window by position through KvStreams::evict_streams, and a sliding-window layer, whose attention
// reads its last slots, keeps its tail in slot order (sliding_window_tail.h).
//
// Over a KIVI store (--kv-cache-dtype kivi2|kivi4; docs/fidelity.md, "StreamingLLM over KIVI") a stream drops whole
// sealed groups only (KvStreams::sealed_groups: G tokens whose keys and values are all quantized, one page): after
// each step, the oldest groups past the ones holding the sinks, each once every token of it lies before the
// stream's last budget - sink_tokens and is sealed. So a stream keeps the sinks' groups whole, StreamingLLM's recent
// tokens and the rest of the oldest group they reach into, and the store's full-precision window: StreamingLLM's
// kept set rounded out to whole groups (a sliding-window layer keeps its tail the same way, without sinks). The
// store drops a group by handing its page back, so no row moves, on the CPU or the GPU.
//
// RoPE: keys are cached post-RoPE and keep their original rotation; new tokens keep their absolute positions
// (the kvpress StreamingLLMPress default, without KeyRerotationPress). The reference's pos-shift variant (keys
// cached pre-RoPE and re-rotated to cache-relative positions at every step) is out of scope.
//
// Config: budget (tokens kept per stream, default 2048, the "StreamingLLM (2048)"), sink_tokens
// (default 4, the reference's start_size and kvpress's n_sink); budget > sink_tokens.
#pragma once

#include <span>
#include <vector>

#include "sparse/budget_eviction.h"
#include "sparse/method_config.h"
#include "sparse/method_runtime.h"

namespace se {

class StreamingLlmMethod final : public MethodRuntime {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  // Every stream holds min(num_tokens, budget) tokens once a step is done (budget_resident_pages); over KIVI at
  // most max_kept_in_groups tokens (KiviCacheManager::sealed_group_eviction_pages).
  int64_t resident_pages(const KvLayout& layout, int32_t num_prefill_tokens, int32_t num_tokens) const override;
  // Compacts every stream of the step's sequences that grew past the budget.
  void finish_step(StepContext& ctx) override;

 private:
  StreamingLlmMethod(nlohmann::ordered_json config, int32_t budget, int32_t num_sink_tokens);

  // Over a store of quantized groups: the most tokens a stream holds after a step, the sinks' groups and the larger
  // of the recent tokens and the store's window, plus all but one token of a group.
  int32_t max_kept_in_groups(const KvLayout& layout) const;
  // Where the groups holding the sinks end: the sinks rounded up to whole groups of `group_size` tokens.
  int32_t sinks_end(int32_t group_size) const { return (num_sink_tokens_ + group_size - 1) / group_size * group_size; }
  // Drops the sealed groups of sequence `slice` the rule above lets go, every stream in one evict_streams call.
  void drop_sealed_groups(StepContext& ctx, const SequenceSlice& slice, int32_t group_size);
  // The slot of `positions` holding the num_sink_tokens_-th smallest position: the oldest the window holds.
  int32_t oldest_window_slot(std::span<const int32_t> positions);
  // The slots of `positions` holding its num_sink_tokens_ smallest and budget_ - num_sink_tokens_ largest
  // positions, ascending.
  void keep_by_position(std::span<const int32_t> positions, std::vector<int32_t>& kept);

  int32_t budget_ = 0;                                   // tokens per stream after eviction
  int32_t num_sink_tokens_ = 0;                          // leading tokens never evicted
  BudgetEvictionScratch scratch_;  // of finish_step
  std::vector<int32_t> order_;     // of oldest_window_slot and keep_by_position
};

}  // namespace se
