// Gemma 3 (text): sandwich norms around attention and MLP, q/k RMSNorm, GeGLU (tanh GELU), embeddings scaled
// by sqrt(hidden_size), tied embeddings, and interleaved sliding-window (local RoPE base) and global layers.
#include <array>
#include <cmath>

#include <nlohmann/json.hpp>

#include "model/arch/arch_registry.h"
#include "model/config_json.h"
#include "model/layers/attention.h"
#include "model/layers/gated_mlp.h"

namespace se {

namespace {
constexpr std::array<std::string_view, 2> kModelTypes = {"gemma3_text", "gemma3"};

// Which layers slide: an explicit `layer_types` list, else every `sliding_window_pattern`-th layer is global.
Status assign_layer_types(const nlohmann::json& hf, ModelConfig& config) {
  if (hf.contains("layer_types") && hf["layer_types"].is_array()) {
    const auto& types = hf["layer_types"];
    if (static_cast<int>(types.size()) != config.num_layers)
      return invalid_argument("config: layer_types has {} entries for {} layers", types.size(), config.num_layers);
    for (int i = 0; i < config.num_layers; ++i) {
      const auto& t = types[static_cast<size_t>(i)];
      if (!t.is_string()) return invalid_argument("config: layer_types[{}] must be a string", i);
      config.layers[static_cast<size_t>(i)].sliding = t.get<std::string>() == "sliding_attention";
    }
    return Status::ok();
  }
  SE_ASSIGN_OR_RETURN(int pattern, config_json::int_or(hf, "sliding_window_pattern", 6));
  if (pattern <= 0) return invalid_argument("config: sliding_window_pattern must be positive");
  for (int i = 0; i < config.num_layers; ++i) config.layers[static_cast<size_t>(i)].sliding = (i + 1) % pattern != 0;
  return Status::ok();
}

Status configure(const nlohmann::json& hf, ModelConfig& config) {
  namespace cj = config_json;
  config.qk_norm = true;
  config.sandwich_norm = true;
  config.activation = Activation::kGeluTanh;
  config.embedding_scale = std::sqrt(static_cast<float>(config.hidden_size));
  SE_ASSIGN_OR_RETURN(config.tie_word_embeddings, cj::bool_or(hf, "tie_word_embeddings", true));
  SE_ASSIGN_OR_RETURN(float query_scalar, cj::float_or(hf, "query_pre_attn_scalar", config.head_dim));
  if (query_scalar <= 0.0f) return invalid_argument("config: query_pre_attn_scalar must be positive");
  config.attention_scale = 1.0f / std::sqrt(query_scalar);
  SE_ASSIGN_OR_RETURN(config.sliding_window, cj::int_or(hf, "sliding_window", 4096));
  SE_ASSIGN_OR_RETURN(config.attn_logit_softcap, cj::float_or(hf, "attn_logit_softcapping", 0.0f));
  SE_ASSIGN_OR_RETURN(config.final_logit_softcap, cj::float_or(hf, "final_logit_softcapping", 0.0f));
  SE_RETURN_IF_ERROR(assign_layer_types(hf, config));

  // Local layers use their own RoPE base and no scaling.
  SE_ASSIGN_OR_RETURN(float local_theta, cj::float_or(hf, "rope_local_base_freq", 10000.0f));
  for (LayerConfig& layer : config.layers) {
    if (!layer.sliding) continue;
    layer.rope = RopeParams{};
    layer.rope.theta = local_theta;
    layer.rope.rotary_dim = config.head_dim;
  }
  return Status::ok();
}

// Sandwich block: attention and MLP outputs are normed before they join the residual stream, so neither add
// fuses into its GEMM; add_rms_norm fuses the attention add with the pre-MLP norm instead.
void block(const BlockInputs& in) {
  const float eps = in.config.rms_norm_eps;
  const LayerWeights& w = in.weights;
  const TensorView h = in.ws.hidden(in.t);
  const TensorView x = in.ws.normed(in.t);
  const TensorView out = in.ws.proj(in.t);
  rms_norm(x, h, w.input_norm.view(), eps);
  attention_out(in, out, x);
  rms_norm(out, out, w.post_attention_norm.view(), eps);
  add_rms_norm(x, h, out, w.pre_feedforward_norm.view(), eps);
  gated_mlp_out(in, out, x);
  rms_norm(out, out, w.post_feedforward_norm.view(), eps);
  add_inplace(h, out);
}
}  // namespace

const ArchSpec kGemma3Arch{"gemma3", kModelTypes, &configure, &block};

}  // namespace se
