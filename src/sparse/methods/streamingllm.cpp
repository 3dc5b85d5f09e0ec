#include "sparse/methods/streamingllm.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"
#include "sparse/budget_eviction.h"

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
    : config_(std::move(config)), budget_(budget), num_sink_tokens_(num_sink_tokens) {
  traits_.family = MethodFamily::kEviction;
  traits_.keeps_full_history = false;
  traits_.score_needs = ScoreNeeds::kNone;
  traits_.prefix_mode = PrefixMode::kChain;
  traits_.prefill_policy = PrefillPolicy::kEvictDuring;
}

int64_t StreamingLlmMethod::resident_pages(const KvLayout& layout, int32_t /*num_prefill_tokens*/,
                                           int32_t num_tokens) const {
  return layout.pages_for_tokens(std::min(num_tokens, budget_));
}

void StreamingLlmMethod::finish_step(StepContext& ctx) {
  const int32_t num_recent = budget_ - num_sink_tokens_;
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    // kept = [0, sinks) ++ [len - recent, len), ascending and disjoint since len > sinks + recent. A
    // sliding-window layer keeps no sinks: it cannot see them.
    evict_to_budget(ctx, slice.seq_slot, budget_, "streamingllm", scratch_,
                    [&](int /*layer*/, int /*kv_head*/, int32_t len, std::vector<int32_t>& kept) {
                      kept.resize(static_cast<size_t>(budget_));
                      std::iota(kept.begin(), kept.begin() + num_sink_tokens_, 0);
                      std::iota(kept.begin() + num_sink_tokens_, kept.end(), len - num_recent);
                    });
  }
}

}  // namespace se
