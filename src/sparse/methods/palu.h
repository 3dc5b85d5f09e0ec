// palu (shadowpa0327/Palu; docs/fidelity.md "Palu"): low-rank KV. At load time each layer's W_k and W_v are factored
// group by group (LowRankKv: groups of head_group_size KV heads, plain SVD to the configured rank, as Palu's
// HeadwiseLowRankModule.from_linear does; SVD-LLM's whitening, which Palu's released checkpoints use, needs
// calibration activations and is not done); the cache keeps
// each token's latents h = R x instead of its K/V (a kLowRankLatent store: k_rank + v_rank values per token and
// group), and attention rebuilds the keys from them, rotates them at their positions and applies U_v after the
// softmax (paged_low_rank_attention). Nothing is evicted: the store is a plain paged store of latents, so the radix
// prefix cache shares it. Ranks: k_rank / v_rank per group when given, else rank_ratio of the group's
// head_group_size * head_dim rows. Without the model in its MethodEnvironment it only validates its config, and
// refuses to build a cache. CPU only. Engine thread only.
// Tensor parallelism: the groups are the whole model's; each rank factors its own KV heads' rows (its model's part),
// and a group that would span ranks is refused.
#pragma once

#include <optional>

#include "sparse/low_rank_kv.h"
#include "sparse/method_config.h"
#include "sparse/method_environment.h"
#include "sparse/method_runtime.h"

namespace se {

class PaluMethod final : public MethodRuntime {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config,
                                                       const MethodEnvironment& environment);

  const LowRankKv* low_rank_kv() const override { return factors_ ? &*factors_ : nullptr; }
  Result<std::unique_ptr<CacheManager>> create_cache(const CacheSpec& spec) override;

 private:
  PaluMethod(nlohmann::ordered_json config, std::optional<LowRankKv> factors);

  std::optional<LowRankKv> factors_;  // empty: no model was given
};

}  // namespace se
