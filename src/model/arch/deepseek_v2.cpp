// DeepSeek-V2 (DeepSeek-V2-Lite, DeepSeek-V2): multi-head latent attention (model/layers/latent_attention.h) in a
// Llama-shaped pre-norm block whose MLP is dense in the first `first_k_dense_replace` layers and, from there on
// every `moe_layer_freq`-th layer, a mixture of `n_routed_experts` SwiGLU experts (top `num_experts_per_tok`,
// softmax scores, greedy choice) plus `n_shared_experts` shared ones that every token runs. The routing follows
// the checkpoints' own modeling_deepseek.py: the chosen probabilities are renormalized when norm_topk_prob is set
// and more than one expert is chosen, else multiplied by routed_scaling_factor. Attention scores take
// 1/sqrt(qk_nope + qk_rope), times yarn's mscale(mscale_all_dim)^2 under yarn scaling. HF checkpoints store one
// tensor per expert; GGUF files of this architecture are not read yet.
#include <array>
#include <cmath>

#include <nlohmann/json.hpp>

#include "model/arch/arch_registry.h"
#include "model/arch/llama.h"
#include "model/config_json.h"
#include "model/hf_config.h"
#include "model/layers/gated_mlp.h"
#include "model/layers/latent_attention.h"
#include "model/layers/moe.h"

namespace se {

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"deepseek_v2"};

// The common checks read head_dim and num_key_value_heads, which mean something else here: every head has its own
// key (expanded from the latent) of qk_nope + qk_rope, the width of its query. transformers' own config writes
// head_dim = qk_rope_head_dim, so both are set, not defaulted.
Status prepare_hf(nlohmann::json& hf, const std::string& source) {
  SE_ASSIGN_OR_RETURN(int64_t nope, read_size(hf, "qk_nope_head_dim", kMaxConfigWidth, source));
  SE_ASSIGN_OR_RETURN(int64_t rope, read_size(hf, "qk_rope_head_dim", kMaxConfigWidth, source));
  if (rope % 2 != 0) return invalid_argument("{}: \"qk_rope_head_dim\" ({}) must be even", source, rope);
  hf["head_dim"] = nope + rope;
  if (hf.contains("num_attention_heads")) hf["num_key_value_heads"] = hf["num_attention_heads"];
  return Status::ok();
}

Status finish_hf(nlohmann::json& hf, const std::string& source) {
  SE_RETURN_IF_ERROR(require_silu(hf, source));
  if (hf["attention_bias"].get<bool>())
    return unimplemented("{}: \"attention_bias\" true is not supported for latent attention", source);
  const int64_t layers = hf["num_hidden_layers"].get<int64_t>(), head_dim = hf["head_dim"].get<int64_t>();
  SE_ASSIGN_OR_RETURN(int64_t kv_rank, read_size(hf, "kv_lora_rank", kMaxConfigWidth, source));
  // q_lora_rank null: the model projects queries directly (V2-Lite).
  if (!hf.contains("q_lora_rank") || hf["q_lora_rank"].is_null()) {
    hf["q_lora_rank"] = nullptr;
  } else {
    SE_ASSIGN_OR_RETURN(int64_t q_rank, read_size(hf, "q_lora_rank", kMaxConfigWidth, source));
    hf["q_lora_rank"] = q_rank;
  }
  SE_ASSIGN_OR_RETURN(int64_t v_dim, read_size(hf, "v_head_dim", kMaxConfigWidth, source));
  if (v_dim > head_dim)
    return unimplemented("{}: \"v_head_dim\" ({}) above qk_nope_head_dim + qk_rope_head_dim ({}) is not supported",
                         source, v_dim, head_dim);
  SE_ASSIGN_OR_RETURN(int64_t experts, read_size(hf, "n_routed_experts", kMaxConfigWidth, source));
  SE_ASSIGN_OR_RETURN(int64_t per_token, read_size(hf, "num_experts_per_tok", experts, source));
  SE_ASSIGN_OR_RETURN(int64_t width, read_size(hf, "moe_intermediate_size", kMaxConfigWidth, source));
  int64_t shared = 0;
  if (hf.contains("n_shared_experts") && !hf["n_shared_experts"].is_null()) {
    if (!hf["n_shared_experts"].is_number_integer() || hf["n_shared_experts"].get<int64_t>() < 0 ||
        hf["n_shared_experts"].get<int64_t>() * width > kMaxConfigWidth)
      return invalid_argument("{}: \"n_shared_experts\" must be a small non-negative integer, got {}", source,
                              hf["n_shared_experts"].dump());
    shared = hf["n_shared_experts"].get<int64_t>();
  }
  int64_t first_dense = 0;
  if (hf.contains("first_k_dense_replace") && !hf["first_k_dense_replace"].is_null()) {
    if (!hf["first_k_dense_replace"].is_number_integer() || hf["first_k_dense_replace"].get<int64_t>() < 0 ||
        hf["first_k_dense_replace"].get<int64_t>() > layers)
      return invalid_argument("{}: \"first_k_dense_replace\" must be an integer in [0, {}], got {}", source, layers,
                              hf["first_k_dense_replace"].dump());
    first_dense = hf["first_k_dense_replace"].get<int64_t>();
  }
  SE_ASSIGN_OR_RETURN(int64_t freq, read_size(hf, "moe_layer_freq", kMaxConfigLayers, source, 1));
  SE_ASSIGN_OR_RETURN(double scaling, read_positive(hf, "routed_scaling_factor", 1.0, source));
  SE_ASSIGN_OR_RETURN(bool norm, read_bool(hf, "norm_topk_prob", false, source));
  const std::string method = hf.value("topk_method", std::string("greedy"));
  if (method != "greedy") return unimplemented("{}: \"topk_method\" \"{}\" is not supported (greedy)", source, method);
  const std::string scoring = hf.value("scoring_func", std::string("softmax"));
  if (scoring != "softmax")
    return unimplemented("{}: \"scoring_func\" \"{}\" is not supported (softmax)", source, scoring);
  hf["kv_lora_rank"] = kv_rank;
  hf["v_head_dim"] = v_dim;
  hf["n_routed_experts"] = experts;
  hf["num_experts_per_tok"] = per_token;
  hf["moe_intermediate_size"] = width;
  hf["n_shared_experts"] = shared;
  hf["first_k_dense_replace"] = first_dense;
  hf["moe_layer_freq"] = freq;
  hf["routed_scaling_factor"] = scaling;
  hf["norm_topk_prob"] = norm;
  hf["topk_method"] = method;
  hf["scoring_func"] = scoring;
  return Status::ok();
}

Status from_gguf_metadata(const GgufFile&, nlohmann::json&) {
  return unimplemented("GGUF files of DeepSeek-V2 models are not supported yet; load the HF checkpoint");
}

// yarn_get_mscale of modeling_deepseek.py.
float yarn_mscale(float factor, float mscale) {
  return factor <= 1.0f ? 1.0f : 0.1f * mscale * std::log(factor) + 1.0f;
}

Status configure(const nlohmann::json& hf, ModelConfig& config) {
  namespace cj = config_json;
  SE_ASSIGN_OR_RETURN(config.kv_lora_rank, cj::positive_int(hf, "kv_lora_rank"));
  SE_ASSIGN_OR_RETURN(config.q_lora_rank, cj::int_or(hf, "q_lora_rank", 0));
  SE_ASSIGN_OR_RETURN(config.qk_nope_head_dim, cj::positive_int(hf, "qk_nope_head_dim"));
  SE_ASSIGN_OR_RETURN(config.qk_rope_head_dim, cj::positive_int(hf, "qk_rope_head_dim"));
  SE_ASSIGN_OR_RETURN(config.v_head_dim, cj::positive_int(hf, "v_head_dim"));
  if (config.q_lora_rank < 0) return invalid_argument("config: q_lora_rank must be positive or null");
  if (config.qk_nope_head_dim + config.qk_rope_head_dim != config.head_dim || config.v_head_dim > config.head_dim ||
      config.qk_rope_head_dim % 2 != 0)
    return invalid_argument(
        "config: head_dim {} is not qk_nope_head_dim {} + qk_rope_head_dim {} (even) >= "
        "v_head_dim {}",
        config.head_dim, config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim);
  if (config.num_kv_heads != config.num_heads)
    return invalid_argument("config: latent attention expands a key per head: num_key_value_heads {} must be {}",
                            config.num_kv_heads, config.num_heads);

  SE_ASSIGN_OR_RETURN(config.num_experts, cj::positive_int(hf, "n_routed_experts"));
  SE_ASSIGN_OR_RETURN(config.num_experts_per_tok, cj::positive_int(hf, "num_experts_per_tok"));
  if (config.num_experts_per_tok > config.num_experts)
    return invalid_argument("config: num_experts_per_tok {} exceeds n_routed_experts {}", config.num_experts_per_tok,
                            config.num_experts);
  SE_ASSIGN_OR_RETURN(config.moe_intermediate_size, cj::positive_int(hf, "moe_intermediate_size"));
  SE_ASSIGN_OR_RETURN(int shared, cj::int_or(hf, "n_shared_experts", 0));
  if (shared < 0) return invalid_argument("config: n_shared_experts must not be negative, got {}", shared);
  config.shared_expert_intermediate_size = shared * config.moe_intermediate_size;
  SE_ASSIGN_OR_RETURN(bool norm, cj::bool_or(hf, "norm_topk_prob", false));
  config.norm_topk_prob = norm && config.num_experts_per_tok > 1;
  SE_ASSIGN_OR_RETURN(config.routed_scaling_factor, cj::float_or(hf, "routed_scaling_factor", 1.0f));
  if (!(config.routed_scaling_factor > 0.0f))
    return invalid_argument("config: routed_scaling_factor must be positive, got {}", config.routed_scaling_factor);
  SE_ASSIGN_OR_RETURN(int first_dense, cj::int_or(hf, "first_k_dense_replace", 0));
  SE_ASSIGN_OR_RETURN(int freq, cj::int_or(hf, "moe_layer_freq", 1));
  if (first_dense < 0 || freq <= 0)
    return invalid_argument("config: first_k_dense_replace {} must be >= 0 and moe_layer_freq {} positive", first_dense,
                            freq);

  // Only the rope part of each head turns; yarn's band and cos/sin scale are computed over that part's width.
  float softmax_mscale = 1.0f;
  for (int i = 0; i < config.num_layers; ++i) {
    LayerConfig& layer = config.layers[static_cast<size_t>(i)];
    layer.moe = i >= first_dense && i % freq == 0;
    layer.rope.rotary_dim = config.qk_rope_head_dim;
  }
  if (config.layers[0].rope.scaling == RopeScaling::kYarn && hf["rope_scaling"].is_object()) {
    const nlohmann::json& scaling = hf["rope_scaling"];
    const float factor = config.layers[0].rope.factor;
    SE_ASSIGN_OR_RETURN(float mscale, cj::float_or(scaling, "mscale", 1.0f));
    SE_ASSIGN_OR_RETURN(float mscale_all_dim, cj::float_or(scaling, "mscale_all_dim", 0.0f));
    for (LayerConfig& layer : config.layers)
      layer.rope.attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
    if (mscale_all_dim != 0.0f) softmax_mscale = yarn_mscale(factor, mscale_all_dim);
  }
  config.attention_scale = softmax_mscale * softmax_mscale / std::sqrt(static_cast<float>(config.head_dim));
  return Status::ok();
}

void layer_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs) {
  const int64_t hidden = config.hidden_size, heads = config.num_heads, rank = config.kv_lora_rank;
  // Under tensor parallelism the projections into and out of the heads split by head; the latent's down
  // projection and its norms are whole on every rank, so every rank computes (and keeps) the whole latent.
  const auto add = [&](std::string_view hf, std::string_view gguf, Shape shape, WeightKind kind,
                       WeightSplit split = WeightSplit::kReplicated) {
    specs.push_back({hf_layer_name(layer, hf), gguf_layer_name(layer, gguf), shape, kind, {}, split});
  };
  add("input_layernorm.weight", "attn_norm.weight", Shape{hidden}, WeightKind::kNorm);
  const int64_t q_out = heads * config.head_dim;
  if (config.q_lora_rank > 0) {
    add("self_attn.q_a_proj.weight", "attn_q_a.weight", Shape{config.q_lora_rank, hidden}, WeightKind::kLinear);
    add("self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight", Shape{config.q_lora_rank}, WeightKind::kNorm);
    add("self_attn.q_b_proj.weight", "attn_q_b.weight", Shape{q_out, config.q_lora_rank}, WeightKind::kLinear,
        WeightSplit::kOut);
  } else {
    add("self_attn.q_proj.weight", "attn_q.weight", Shape{q_out, hidden}, WeightKind::kLinear, WeightSplit::kOut);
  }
  add("self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", Shape{rank + config.qk_rope_head_dim, hidden},
      WeightKind::kLinear);
  add("self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight", Shape{rank}, WeightKind::kNorm);
  add("self_attn.kv_b_proj.weight", "attn_kv_b.weight",
      Shape{heads * (config.qk_nope_head_dim + config.v_head_dim), rank}, WeightKind::kLinear, WeightSplit::kOut);
  add("self_attn.o_proj.weight", "attn_output.weight", Shape{hidden, heads * config.v_head_dim}, WeightKind::kLinear,
      WeightSplit::kIn);
  append_layer_norm(config, layer, "post_attention_layernorm.weight", "ffn_norm.weight", specs);
  if (!config.layers[static_cast<size_t>(layer)].moe) {
    append_gated_mlp_weights(config, layer, specs);
    return;
  }
  append_moe_weights(config, layer, specs);
}

void block(const BlockInputs& in) {
  pre_norm_block(in, in.layer_config.moe ? &moe_add : &gated_mlp_add, &latent_attention_add);
}
}  // namespace

const ArchSpec kDeepseekV2Arch{.name = "deepseek_v2",
                               .model_types = kModelTypes,
                               .hf_architecture = "DeepseekV2ForCausalLM",
                               .gguf_architecture = "deepseek2",
                               .prepare_hf = &prepare_hf,
                               .finish_hf = &finish_hf,
                               .from_gguf_metadata = &from_gguf_metadata,
                               .configure = &configure,
                               .layer_weights = &layer_weights,
                               .from_gguf_tensor = nullptr,
                               .from_hf_tensor = nullptr,
                               .block = &block};

}  // namespace se
