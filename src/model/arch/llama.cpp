// Llama 2/3.x and SmolLM2: pre-norm blocks, SwiGLU MLP, RoPE (optionally llama3- or linearly scaled).
#include "model/arch/llama.h"

#include <array>

#include "loader/weight_transforms.h"
#include "model/arch/arch_registry.h"
#include "model/hf_config.h"
#include "model/layers/attention.h"
#include "model/layers/gated_mlp.h"

namespace se {

void pre_norm_block(const BlockInputs& in, SublayerAddFn mlp_add, SublayerAddFn attention_add) {
  const float eps = in.config.rms_norm_eps;
  const TensorView h = in.ws.hidden(in.t);
  const TensorView x = in.ws.normed(in.t);
  rms_norm(x, h, in.weights.input_norm.view(), eps);
  attention_add(in, h, x);
  rms_norm(x, h, in.weights.post_attention_norm.view(), eps);
  mlp_add(in, h, x);
}

void llama_block(const BlockInputs& in) { pre_norm_block(in, &gated_mlp_add); }

void llama_layer_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs) {
  append_attention_weights(config, layer, specs);
  append_layer_norm(config, layer, "post_attention_layernorm.weight", "ffn_norm.weight", specs);
  append_gated_mlp_weights(config, layer, specs);
}

Status llama_finish_hf(nlohmann::json& hf, const std::string& source) { return require_silu(hf, source); }

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"llama"};

Status configure(const nlohmann::json&, ModelConfig&) { return Status::ok(); }

// llama.cpp's converter interleaves the rotary halves of each Q and K head (LlamaModel.permute); undo it.
Tensor from_gguf_tensor(const ModelConfig& config, const WeightSpec& spec, Tensor t) {
  if (spec.gguf_name.find(".attn_q.") != std::string::npos) return unpermute_qk_rows(t, config.num_heads);
  if (spec.gguf_name.find(".attn_k.") != std::string::npos) return unpermute_qk_rows(t, config.num_kv_heads);
  return t;
}
}  // namespace

const ArchSpec kLlamaArch{.name = "llama",
                          .model_types = kModelTypes,
                          .hf_architecture = "LlamaForCausalLM",
                          .gguf_architecture = "llama",
                          .prepare_hf = nullptr,
                          .finish_hf = &llama_finish_hf,
                          .from_gguf_metadata = nullptr,
                          .configure = &configure,
                          .layer_weights = &llama_layer_weights,
                          .from_gguf_tensor = &from_gguf_tensor,
                          .from_hf_tensor = nullptr,
                          .block = &llama_block};

}  // namespace se
