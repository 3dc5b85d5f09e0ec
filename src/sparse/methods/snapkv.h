// snapkv: SnapKV (FasterDecoding/SnapKV `SnapKVCluster.update_kv`; kvpress `SnapKVPress`). Once, at the end of the
// prompt, every (layer, KV head) keeps the `budget - window` prefix tokens the observation window attends to
// most (pooled scores, observation_window_scores.h) plus the `window` newest prompt tokens; decode tokens are
// then appended without further eviction. Engine thread only (the lifecycle is ObservationWindowMethod's).
//
// Config and the reference each default follows:
//   budget 2048      tokens kept per (layer, KV head), the window included: SnapKV/KVCache-Factory "capacity"
//                    (`init_snapkv` default 2048, the benchmark); kvpress's ratio is not offered.
//   window 64, kernel 5, pooling avgpool: kvpress SnapKVPress (SnapKV's own init uses window 32).
//   gqa_agg mean, gqa_order pool_then_reduce: kvpress (pool per query head, then mean over the group).
// Prompts of T <= budget are not compressed (the reference skips T < capacity; T == capacity keeps all anyway).
// Over an MLA model's shared latent (one "KV head" for all query heads) the window's scores come from the absorbed
// queries, and gqa_agg reduces every head into the one kept set of latent rows.
#pragma once

#include "sparse/methods/observation_window_method.h"

namespace se {

class SnapKvMethod final : public ObservationWindowMethod {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

 private:
  SnapKvMethod(nlohmann::ordered_json config, const ObservationWindowConfig& window_config);
  // Per head: the top budget - window pooled scores.
  std::vector<std::vector<int32_t>> select_prefix(const WindowScores& scores, int layer,
                                                  int num_layers) const override;
  // Every stream holds budget + num_decode_tokens tokens.
  int64_t compressed_pages(const KvLayout& layout, int32_t num_prompt_tokens,
                           int32_t num_decode_tokens) const override;
};

}  // namespace se
