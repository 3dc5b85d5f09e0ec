#include "model/weight_spec.h"

#include <fmt/format.h>

#include "model/arch/arch_registry.h"

namespace se {

std::string hf_layer_name(int layer, std::string_view suffix) {
  return fmt::format("model.layers.{}.{}", layer, suffix);
}

std::string gguf_layer_name(int layer, std::string_view suffix) { return fmt::format("blk.{}.{}", layer, suffix); }

void append_attention_weights(const ModelConfig& c, int layer, std::vector<WeightSpec>& specs) {
  const int64_t hidden = c.hidden_size, q_out = c.q_size(), kv_out = c.kv_size();
  const auto add = [&](std::string_view hf, std::string_view gguf, Shape shape, WeightKind kind,
                       WeightSplit split = WeightSplit::kReplicated) {
    specs.push_back({hf_layer_name(layer, hf), gguf_layer_name(layer, gguf), shape, kind, {}, split});
  };
  add("input_layernorm.weight", "attn_norm.weight", Shape{hidden}, WeightKind::kNorm);
  add("self_attn.q_proj.weight", "attn_q.weight", Shape{q_out, hidden}, WeightKind::kLinear, WeightSplit::kOut);
  add("self_attn.k_proj.weight", "attn_k.weight", Shape{kv_out, hidden}, WeightKind::kLinear, WeightSplit::kKvHeads);
  add("self_attn.v_proj.weight", "attn_v.weight", Shape{kv_out, hidden}, WeightKind::kLinear, WeightSplit::kKvHeads);
  add("self_attn.o_proj.weight", "attn_output.weight", Shape{hidden, q_out}, WeightKind::kLinear, WeightSplit::kIn);
  if (c.attention_bias) {
    add("self_attn.q_proj.bias", "attn_q.bias", Shape{q_out}, WeightKind::kBias, WeightSplit::kOut);
    add("self_attn.k_proj.bias", "attn_k.bias", Shape{kv_out}, WeightKind::kBias, WeightSplit::kKvHeads);
    add("self_attn.v_proj.bias", "attn_v.bias", Shape{kv_out}, WeightKind::kBias, WeightSplit::kKvHeads);
  }
  if (c.qk_norm) {
    add("self_attn.q_norm.weight", "attn_q_norm.weight", Shape{c.head_dim}, WeightKind::kNorm);
    add("self_attn.k_norm.weight", "attn_k_norm.weight", Shape{c.head_dim}, WeightKind::kNorm);
  }
}

void append_layer_norm(const ModelConfig& c, int layer, std::string_view hf, std::string_view gguf,
                       std::vector<WeightSpec>& specs) {
  specs.push_back(
      {hf_layer_name(layer, hf), gguf_layer_name(layer, gguf), Shape{c.hidden_size}, WeightKind::kNorm, {}});
}

void append_gated_mlp_weights(const ModelConfig& c, int layer, std::vector<WeightSpec>& specs) {
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const auto add = [&](std::string_view hf, std::string_view gguf, Shape shape, WeightSplit split) {
    specs.push_back({hf_layer_name(layer, hf), gguf_layer_name(layer, gguf), shape, WeightKind::kLinear, {}, split});
  };
  add("mlp.gate_proj.weight", "ffn_gate.weight", Shape{inter, hidden}, WeightSplit::kOut);
  add("mlp.up_proj.weight", "ffn_up.weight", Shape{inter, hidden}, WeightSplit::kOut);
  add("mlp.down_proj.weight", "ffn_down.weight", Shape{hidden, inter}, WeightSplit::kIn);
}

void append_moe_weights(const ModelConfig& c, int layer, std::vector<WeightSpec>& specs) {
  const int64_t experts = c.num_experts, hidden = c.hidden_size, inter = c.moe_intermediate_size;
  const auto add = [&](std::string_view hf, std::string_view gguf, Shape shape, WeightSplit split) {
    specs.push_back({hf_layer_name(layer, hf), gguf_layer_name(layer, gguf), shape, WeightKind::kLinear, {}, split});
  };
  // Every rank routes every token (the router is whole) and holds its part of each expert's width.
  add("mlp.gate.weight", "ffn_gate_inp.weight", Shape{experts, hidden}, WeightSplit::kReplicated);
  const auto add_experts = [&](std::string_view proj, std::string_view gguf, Shape shape, WeightSplit split) {
    WeightSpec spec{hf_layer_name(layer, fmt::format("mlp.experts.{}.weight", proj)),
                    gguf_layer_name(layer, gguf),
                    shape,
                    WeightKind::kLinear,
                    {},
                    split};
    for (int64_t e = 0; e < experts; ++e)
      spec.hf_parts.push_back(hf_layer_name(layer, fmt::format("mlp.experts.{}.{}.weight", e, proj)));
    specs.push_back(std::move(spec));
  };
  add_experts("gate_proj", "ffn_gate_exps.weight", Shape{experts, inter, hidden}, WeightSplit::kOut);
  add_experts("up_proj", "ffn_up_exps.weight", Shape{experts, inter, hidden}, WeightSplit::kOut);
  add_experts("down_proj", "ffn_down_exps.weight", Shape{experts, hidden, inter}, WeightSplit::kIn);
  if (const int64_t shared = c.shared_expert_intermediate_size; shared > 0) {
    add("mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight", Shape{shared, hidden}, WeightSplit::kOut);
    add("mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight", Shape{shared, hidden}, WeightSplit::kOut);
    add("mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight", Shape{hidden, shared}, WeightSplit::kIn);
  }
}

std::vector<WeightSpec> expected_weights(const ModelConfig& c) {
  const int64_t vocab = c.vocab_size, hidden = c.hidden_size;
  std::vector<WeightSpec> specs;
  specs.push_back({"model.embed_tokens.weight",
                   "token_embd.weight",
                   Shape{vocab, hidden},
                   WeightKind::kEmbedding,
                   {},
                   WeightSplit::kVocab});
  const ArchSpec& arch = arch_of(c);
  for (int layer = 0; layer < c.num_layers; ++layer) arch.layer_weights(c, layer, specs);
  specs.push_back({"model.norm.weight", "output_norm.weight", Shape{hidden}, WeightKind::kNorm, {}});
  if (!c.tie_word_embeddings)
    specs.push_back(
        {"lm_head.weight", "output.weight", Shape{vocab, hidden}, WeightKind::kLinear, {}, WeightSplit::kVocab});
  return specs;
}

}  // namespace se
