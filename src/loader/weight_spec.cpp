#include "loader/weight_spec.h"

#include <string_view>
#include <utility>

namespace se {

namespace {

// Per-layer suffixes: HF name after "model.layers.N." and GGUF name after "blk.N.".
struct LayerName {
  std::string_view hf;
  std::string_view gguf;
};

constexpr LayerName kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},  // gemma3
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
};

}  // namespace

std::vector<WeightSpec> expected_weights(const ModelDims& d) {
  std::vector<WeightSpec> specs;
  const int64_t q_out = d.num_heads * d.head_dim;
  const int64_t kv_out = d.num_kv_heads * d.head_dim;
  specs.push_back(
      {"model.embed_tokens.weight", Shape{d.vocab_size, d.hidden_size}, WeightKind::kEmbedding});
  for (int64_t i = 0; i < d.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto add = [&](const std::string& suffix, Shape shape, WeightKind kind) {
      specs.push_back({p + suffix, shape, kind});
    };
    add("input_layernorm.weight", Shape{d.hidden_size}, WeightKind::kNorm);
    add("self_attn.q_proj.weight", Shape{q_out, d.hidden_size}, WeightKind::kLinear);
    add("self_attn.k_proj.weight", Shape{kv_out, d.hidden_size}, WeightKind::kLinear);
    add("self_attn.v_proj.weight", Shape{kv_out, d.hidden_size}, WeightKind::kLinear);
    add("self_attn.o_proj.weight", Shape{d.hidden_size, q_out}, WeightKind::kLinear);
    if (d.attention_bias) {
      add("self_attn.q_proj.bias", Shape{q_out}, WeightKind::kBias);
      add("self_attn.k_proj.bias", Shape{kv_out}, WeightKind::kBias);
      add("self_attn.v_proj.bias", Shape{kv_out}, WeightKind::kBias);
    }
    if (d.qk_norm) {
      add("self_attn.q_norm.weight", Shape{d.head_dim}, WeightKind::kNorm);
      add("self_attn.k_norm.weight", Shape{d.head_dim}, WeightKind::kNorm);
    }
    add("post_attention_layernorm.weight", Shape{d.hidden_size}, WeightKind::kNorm);
    if (d.sandwich_norm) {
      add("pre_feedforward_layernorm.weight", Shape{d.hidden_size}, WeightKind::kNorm);
      add("post_feedforward_layernorm.weight", Shape{d.hidden_size}, WeightKind::kNorm);
    }
    add("mlp.gate_proj.weight", Shape{d.intermediate_size, d.hidden_size}, WeightKind::kLinear);
    add("mlp.up_proj.weight", Shape{d.intermediate_size, d.hidden_size}, WeightKind::kLinear);
    add("mlp.down_proj.weight", Shape{d.hidden_size, d.intermediate_size}, WeightKind::kLinear);
  }
  specs.push_back({"model.norm.weight", Shape{d.hidden_size}, WeightKind::kNorm});
  if (!d.tie_word_embeddings) {
    specs.push_back({"lm_head.weight", Shape{d.vocab_size, d.hidden_size}, WeightKind::kLinear});
  }
  return specs;
}

std::string gguf_tensor_name(const std::string& hf_name, ModelArch arch) {
  if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf_name == "model.norm.weight") return "output_norm.weight";
  if (hf_name == "lm_head.weight") return "output.weight";
  constexpr std::string_view kPrefix = "model.layers.";
  std::string_view name = hf_name;
  if (name.substr(0, kPrefix.size()) != kPrefix) return "";
  name.remove_prefix(kPrefix.size());
  const size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0) return "";
  const std::string layer(name.substr(0, dot));
  const std::string_view suffix = name.substr(dot + 1);
  // The norm after attention is llama.cpp's "ffn_norm" in pre-norm models, but a real
  // post-attention norm in Gemma 3, whose pre-MLP norm takes the "ffn_norm" name.
  if (suffix == "post_attention_layernorm.weight") {
    return "blk." + layer +
           (arch == ModelArch::kGemma3 ? ".post_attention_norm.weight" : ".ffn_norm.weight");
  }
  for (const LayerName& n : kLayerNames) {
    if (suffix == n.hf) return "blk." + layer + "." + std::string(n.gguf);
  }
  return "";
}

}  // namespace se
