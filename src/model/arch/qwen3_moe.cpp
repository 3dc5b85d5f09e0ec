// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3 block (q/k RMSNorm, no q/k/v biases) whose MLP is a
// mixture of SwiGLU experts (model/layers/moe.h) in every `decoder_sparse_step`-th layer not listed in
// `mlp_only_layers`, the dense gated MLP elsewhere. HF checkpoints store one tensor per expert
// (mlp.experts.{e}.gate_proj.weight); GGUF files (llama.cpp's "qwen3moe") stack them (ffn_gate_exps.weight).
#include <array>
#include <set>

#include <nlohmann/json.hpp>

#include "model/arch/arch_registry.h"
#include "model/arch/llama.h"
#include "model/config_json.h"
#include "model/hf_config.h"
#include "model/layers/gated_mlp.h"
#include "model/layers/moe.h"

namespace se {

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"qwen3_moe"};

// The experts' keys, checked here so that a bad config names its file.
Status finish_hf(nlohmann::json& hf, const std::string& source) {
  SE_RETURN_IF_ERROR(require_silu(hf, source));
  SE_ASSIGN_OR_RETURN(int64_t experts, read_size(hf, "num_experts", kMaxConfigWidth, source));
  SE_ASSIGN_OR_RETURN(int64_t per_token, read_size(hf, "num_experts_per_tok", experts, source));
  SE_ASSIGN_OR_RETURN(int64_t width, read_size(hf, "moe_intermediate_size", kMaxConfigWidth, source));
  SE_ASSIGN_OR_RETURN(int64_t step, read_size(hf, "decoder_sparse_step", kMaxConfigLayers, source, 1));
  SE_ASSIGN_OR_RETURN(bool norm, read_bool(hf, "norm_topk_prob", false, source));
  hf["num_experts"] = experts;
  hf["num_experts_per_tok"] = per_token;
  hf["moe_intermediate_size"] = width;
  hf["decoder_sparse_step"] = step;
  hf["norm_topk_prob"] = norm;
  if (!hf.contains("mlp_only_layers") || hf["mlp_only_layers"].is_null())
    hf["mlp_only_layers"] = nlohmann::json::array();
  const int64_t layers = hf["num_hidden_layers"].get<int64_t>();
  if (!hf["mlp_only_layers"].is_array())
    return invalid_argument("{}: \"mlp_only_layers\" must be a list of layer indices", source);
  for (const auto& layer : hf["mlp_only_layers"]) {
    if (!layer.is_number_integer() || layer.get<int64_t>() < 0 || layer.get<int64_t>() >= layers)
      return invalid_argument("{}: \"mlp_only_layers\" entry {} is not a layer index below {}", source, layer.dump(),
                              layers);
  }
  return Status::ok();
}

// llama.cpp's qwen3moe keys. Its converter keeps neither decoder_sparse_step nor mlp_only_layers (every layer
// routes), and llama.cpp always renormalizes the chosen experts' probabilities.
Status from_gguf_metadata(const GgufFile& file, nlohmann::json& hf) {
  const auto key = [&file](const char* suffix) { return file.architecture() + "." + suffix; };
  SE_ASSIGN_OR_RETURN(uint32_t experts, file.get_u32(key("expert_count")));
  SE_ASSIGN_OR_RETURN(uint32_t per_token, file.get_u32(key("expert_used_count")));
  SE_ASSIGN_OR_RETURN(uint32_t width, file.get_u32(key("expert_feed_forward_length")));
  hf["num_experts"] = experts;
  hf["num_experts_per_tok"] = per_token;
  hf["moe_intermediate_size"] = width;
  hf["norm_topk_prob"] = true;
  return Status::ok();
}

Status configure(const nlohmann::json& hf, ModelConfig& config) {
  namespace cj = config_json;
  config.qk_norm = true;
  SE_ASSIGN_OR_RETURN(config.num_experts, cj::positive_int(hf, "num_experts"));
  SE_ASSIGN_OR_RETURN(config.num_experts_per_tok, cj::positive_int(hf, "num_experts_per_tok"));
  if (config.num_experts_per_tok > config.num_experts)
    return invalid_argument("config: num_experts_per_tok {} exceeds num_experts {}", config.num_experts_per_tok,
                            config.num_experts);
  SE_ASSIGN_OR_RETURN(config.moe_intermediate_size, cj::positive_int(hf, "moe_intermediate_size"));
  SE_ASSIGN_OR_RETURN(config.norm_topk_prob, cj::bool_or(hf, "norm_topk_prob", false));
  SE_ASSIGN_OR_RETURN(int step, cj::int_or(hf, "decoder_sparse_step", 1));
  if (step <= 0) return invalid_argument("config: decoder_sparse_step must be positive, got {}", step);
  std::set<int> dense;
  if (hf.contains("mlp_only_layers") && hf["mlp_only_layers"].is_array()) {
    for (const auto& layer : hf["mlp_only_layers"]) {
      if (!layer.is_number_integer()) return invalid_argument("config: mlp_only_layers entries must be integers");
      dense.insert(layer.get<int>());
    }
  }
  // transformers' Qwen3MoeDecoderLayer: sparse when not listed and (layer + 1) is a multiple of the step.
  for (int i = 0; i < config.num_layers; ++i)
    config.layers[static_cast<size_t>(i)].moe = !dense.count(i) && (i + 1) % step == 0;
  return Status::ok();
}

void layer_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs) {
  append_attention_weights(config, layer, specs);
  append_layer_norm(config, layer, "post_attention_layernorm.weight", "ffn_norm.weight", specs);
  if (!config.layers[static_cast<size_t>(layer)].moe) {
    append_gated_mlp_weights(config, layer, specs);
    return;
  }
  append_moe_weights(config, layer, specs);
}

// Pre-norm like Llama; the MoE layers' experts replace the dense MLP.
// Llama's block; a sparse layer's MLP is the mixture of experts.
void block(const BlockInputs& in) { pre_norm_block(in, in.layer_config.moe ? &moe_add : &gated_mlp_add); }
}  // namespace

const ArchSpec kQwen3MoeArch{.name = "qwen3_moe",
                             .model_types = kModelTypes,
                             .hf_architecture = "Qwen3MoeForCausalLM",
                             .gguf_architecture = "qwen3moe",
                             .prepare_hf = nullptr,
                             .finish_hf = &finish_hf,
                             .from_gguf_metadata = &from_gguf_metadata,
                             .configure = &configure,
                             .layer_weights = &layer_weights,
                             .from_gguf_tensor = nullptr,
                             .from_hf_tensor = nullptr,
                             .block = &block};

}  // namespace se
