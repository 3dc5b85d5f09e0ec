#include "sparse/methods/palu.h"

#include <algorithm>
#include <cmath>

#include "model/model.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> PaluMethod::create(const nlohmann::json& config,
                                                          const MethodEnvironment& environment) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("palu", config));
  SE_ASSIGN_OR_RETURN(const double rank_ratio, reader.get_double("rank_ratio", 0.5, 1e-6, 1.0));
  // 0: from rank_ratio.
  SE_ASSIGN_OR_RETURN(const int k_rank, reader.get_int("k_rank", 0, 0, 1 << 20));
  SE_ASSIGN_OR_RETURN(const int v_rank, reader.get_int("v_rank", 0, 0, 1 << 20));
  SE_ASSIGN_OR_RETURN(const int head_group_size, reader.get_int("head_group_size", 4, 1, 1024));
  SE_RETURN_IF_ERROR(reader.finish());
  std::optional<LowRankKv> factors;
  if (environment.model != nullptr) {
    const ModelConfig& c = environment.model->config();
    LowRankKvShape shape;
    // The groups are the whole model's: a tensor-parallel rank factors its own, which must be whole groups.
    const int32_t num_ranks = environment.model->communicator().size();
    shape.group_heads = low_rank_group_heads(c.num_kv_heads * num_ranks / c.kv_head_copies, head_group_size);
    if (c.num_kv_heads % shape.group_heads != 0)
      return invalid_argument(
          "palu: a group of {} KV heads spans tensor-parallel ranks that hold {} each; use a head_group_size that "
          "divides {}",
          shape.group_heads, c.num_kv_heads, c.num_kv_heads);
    const int32_t ratio_rank =
        std::max(1, static_cast<int32_t>(std::lround(rank_ratio * shape.group_heads * c.head_dim)));
    shape.k_rank = k_rank > 0 ? k_rank : ratio_rank;
    shape.v_rank = v_rank > 0 ? v_rank : ratio_rank;
    auto decomposed = LowRankKv::decompose(*environment.model, shape);
    if (!decomposed.is_ok()) return Status(decomposed.status().code(), "palu: " + decomposed.status().message());
    factors.emplace(std::move(decomposed).value());
  }
  return std::unique_ptr<MethodRuntime>(new PaluMethod(reader.resolved(), std::move(factors)));
}

PaluMethod::PaluMethod(nlohmann::ordered_json config, std::optional<LowRankKv> factors)
    : MethodRuntime("palu", std::move(config)), factors_(std::move(factors)) {
  traits_.family = MethodFamily::kCompression;
  traits_.ops = {OpId::kPagedLowRankAttention};
  // The latents are projected and attended to in host memory (the CUDA kernel is not wired into the engine).
  traits_.host_hooks = true;
  // Each tensor-parallel rank factors its KV heads' rows of W_k and W_v, whole groups of the model's (create), and
  // attention reads each group's latents alone.
  traits_.tensor_parallel = true;
}

Result<std::unique_ptr<CacheManager>> PaluMethod::create_cache(const CacheSpec& spec) {
  if (!factors_)
    return failed_precondition("palu: its low-rank factors are computed from the model, which was not given");
  if (!spec.layout.low_rank_latent())
    return invalid_argument("palu keeps a low_rank_latent KV store, not {}", kv_store_kind_name(spec.layout.store));
  return MethodRuntime::create_cache(spec);
}

}  // namespace se
