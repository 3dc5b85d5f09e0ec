#include "model/weights.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "backend/device_memory.h"

namespace se {

namespace {

class TensorTable {
 public:
  explicit TensorTable(const std::map<std::string, Tensor>& tensors) : tensors_(tensors) {}

  // A tensor of `shape`, converted to fp32 for the CPU backend.
  Result<Tensor> get(const std::string& name, Shape shape) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return not_found("weights: missing tensor '{}'", name);
    const Tensor& t = it->second;
    if (t.numel() != shape.numel())
      return invalid_argument("weights: tensor '{}' has shape {}, expected {}", name, t.shape().to_string(),
                              shape.to_string());
    Tensor f = t.dtype() == DType::kF32 ? t : t.to_f32();
    return f.reshape(shape);
  }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }

 private:
  const std::map<std::string, Tensor>& tensors_;
};

// Stacks row blocks into one [sum(rows), cols] fp32 tensor.
Tensor concat_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.dim(0);
  const int64_t cols = parts[0].rank() == 2 ? parts[0].dim(1) : 1;
  Tensor out = Tensor::empty(DType::kF32, parts[0].rank() == 2 ? Shape{rows, cols} : Shape{rows});
  char* dst = static_cast<char*>(out.raw());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.raw(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

// gate, up [experts, inter, hidden] fp32 -> [experts, 2 * inter, hidden]: each expert's gate rows, then its up
// rows, so one GEMM per expert computes both.
Tensor stack_expert_gate_up(const Tensor& gate, const Tensor& up) {
  const int64_t experts = gate.dim(0), inter = gate.dim(1), hidden = gate.dim(2);
  Tensor out = Tensor::empty(DType::kF32, {experts, 2 * inter, hidden});
  const size_t block = static_cast<size_t>(inter * hidden) * sizeof(float);
  for (int64_t e = 0; e < experts; ++e) {
    char* dst = static_cast<char*>(out.raw()) + 2 * static_cast<size_t>(e) * block;
    std::memcpy(dst, static_cast<const char*>(gate.raw()) + static_cast<size_t>(e) * block, block);
    std::memcpy(dst + block, static_cast<const char*>(up.raw()) + static_cast<size_t>(e) * block, block);
  }
  return out;
}

// The q/k/v projections (stacked), their biases and per-head norms, and o_proj of the layer named by prefix `p`.
Status load_attention(const ModelConfig& c, const TensorTable& table, const std::string& p, LayerWeights& l) {
  const int64_t hidden = c.hidden_size;
  SE_ASSIGN_OR_RETURN(Tensor q, table.get(p + "self_attn.q_proj.weight", {c.q_size(), hidden}));
  SE_ASSIGN_OR_RETURN(Tensor k, table.get(p + "self_attn.k_proj.weight", {c.kv_size(), hidden}));
  SE_ASSIGN_OR_RETURN(Tensor v, table.get(p + "self_attn.v_proj.weight", {c.kv_size(), hidden}));
  l.qkv = concat_rows({q, k, v});
  if (c.attention_bias) {
    SE_ASSIGN_OR_RETURN(Tensor qb, table.get(p + "self_attn.q_proj.bias", {c.q_size()}));
    SE_ASSIGN_OR_RETURN(Tensor kb, table.get(p + "self_attn.k_proj.bias", {c.kv_size()}));
    SE_ASSIGN_OR_RETURN(Tensor vb, table.get(p + "self_attn.v_proj.bias", {c.kv_size()}));
    l.qkv_bias = concat_rows({qb, kb, vb});
  }
  if (c.qk_norm) {
    SE_ASSIGN_OR_RETURN(l.q_norm, table.get(p + "self_attn.q_norm.weight", {c.head_dim}));
    SE_ASSIGN_OR_RETURN(l.k_norm, table.get(p + "self_attn.k_norm.weight", {c.head_dim}));
  }
  SE_ASSIGN_OR_RETURN(l.o_proj, table.get(p + "self_attn.o_proj.weight", {hidden, c.q_size()}));
  return Status::ok();
}

// Multi-head latent attention's projections (names as DeepSeek-V2's checkpoints give them).
Status load_latent_attention(const ModelConfig& c, const TensorTable& table, const std::string& p, LayerWeights& l) {
  const int64_t hidden = c.hidden_size, heads = c.num_heads, rope = c.qk_rope_head_dim;
  const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : hidden;
  if (c.q_lora_rank > 0) {
    SE_ASSIGN_OR_RETURN(l.q_a, table.get(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, hidden}));
    SE_ASSIGN_OR_RETURN(l.q_a_norm, table.get(p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}));
    SE_ASSIGN_OR_RETURN(l.q_proj, table.get(p + "self_attn.q_b_proj.weight", {heads * c.head_dim, q_in}));
  } else {
    SE_ASSIGN_OR_RETURN(l.q_proj, table.get(p + "self_attn.q_proj.weight", {heads * c.head_dim, q_in}));
  }
  SE_ASSIGN_OR_RETURN(l.kv_a, table.get(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + rope, hidden}));
  SE_ASSIGN_OR_RETURN(l.kv_a_norm, table.get(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}));
  SE_ASSIGN_OR_RETURN(l.kv_b, table.get(p + "self_attn.kv_b_proj.weight",
                                        {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}));
  SE_ASSIGN_OR_RETURN(l.o_proj, table.get(p + "self_attn.o_proj.weight", {hidden, heads * c.v_head_dim}));
  return Status::ok();
}

}  // namespace

ModelWeights ModelWeights::on_device(Device device) const {
  if (device == Device::kCpu) return *this;
  const auto matrix = [device](const Tensor& t) {
    Tensor bf16 = Tensor::empty(DType::kBF16, t.shape());
    // In blocks across threads: an 8B model converts 8G elements here.
    constexpr int64_t kBlock = int64_t{1} << 20;
    const int64_t num_blocks = (t.numel() + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t begin = b * kBlock;
      convert_from_f32(t.data<float>() + begin, static_cast<uint16_t*>(bf16.raw()) + begin, DType::kBF16,
                       static_cast<size_t>(std::min(kBlock, t.numel() - begin)));
    }
    return to_device(bf16, device);
  };
  const auto vector = [device](const Tensor& t) { return t.defined() ? to_device(t, device) : Tensor(); };
  const auto optional_matrix = [&matrix](const Tensor& t) { return t.defined() ? matrix(t) : Tensor(); };
  ModelWeights w;
  w.embed_tokens = matrix(embed_tokens);
  w.final_norm = vector(final_norm);
  w.lm_head = lm_head.raw() == embed_tokens.raw() ? w.embed_tokens : matrix(lm_head);
  for (const LayerWeights& l : layers) {
    w.layers.push_back({vector(l.input_norm),
                        matrix(l.qkv),
                        vector(l.qkv_bias),
                        vector(l.q_norm),
                        vector(l.k_norm),
                        matrix(l.o_proj),
                        vector(l.post_attention_norm),
                        vector(l.pre_feedforward_norm),
                        vector(l.post_feedforward_norm),
                        optional_matrix(l.gate_up),
                        optional_matrix(l.down),
                        optional_matrix(l.router),
                        optional_matrix(l.experts_gate_up),
                        optional_matrix(l.experts_down),
                        optional_matrix(l.shared_gate_up),
                        optional_matrix(l.shared_down),
                        optional_matrix(l.q_a),
                        vector(l.q_a_norm),
                        optional_matrix(l.q_proj),
                        optional_matrix(l.kv_a),
                        vector(l.kv_a_norm),
                        optional_matrix(l.kv_b)});
  }
  return w;
}

Result<ModelWeights> ModelWeights::build(const ModelConfig& c, const std::map<std::string, Tensor>& tensors) {
  TensorTable table(tensors);
  const int64_t hidden = c.hidden_size;
  ModelWeights w;
  SE_ASSIGN_OR_RETURN(w.embed_tokens, table.get("model.embed_tokens.weight", {c.vocab_size, hidden}));
  SE_ASSIGN_OR_RETURN(w.final_norm, table.get("model.norm.weight", {hidden}));
  if (c.tie_word_embeddings || !table.has("lm_head.weight")) {
    w.lm_head = w.embed_tokens;
  } else {
    SE_ASSIGN_OR_RETURN(w.lm_head, table.get("lm_head.weight", {c.vocab_size, hidden}));
  }
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("model.layers.{}.", i);
    SE_ASSIGN_OR_RETURN(l.input_norm, table.get(p + "input_layernorm.weight", {hidden}));
    if (c.latent_attention()) {
      SE_RETURN_IF_ERROR(load_latent_attention(c, table, p, l));
    } else {
      SE_RETURN_IF_ERROR(load_attention(c, table, p, l));
    }
    SE_ASSIGN_OR_RETURN(l.post_attention_norm, table.get(p + "post_attention_layernorm.weight", {hidden}));
    if (c.sandwich_norm) {
      SE_ASSIGN_OR_RETURN(l.pre_feedforward_norm, table.get(p + "pre_feedforward_layernorm.weight", {hidden}));
      SE_ASSIGN_OR_RETURN(l.post_feedforward_norm,
                          table.get(p + "post_feedforward_layernorm.weight", {hidden}));
    }
    if (c.layers[static_cast<size_t>(i)].moe) {
      const int64_t experts = c.num_experts, inter = c.moe_intermediate_size;
      SE_ASSIGN_OR_RETURN(l.router, table.get(p + "mlp.gate.weight", {experts, hidden}));
      SE_ASSIGN_OR_RETURN(Tensor gate, table.get(p + "mlp.experts.gate_proj.weight", {experts, inter, hidden}));
      SE_ASSIGN_OR_RETURN(Tensor up, table.get(p + "mlp.experts.up_proj.weight", {experts, inter, hidden}));
      l.experts_gate_up = stack_expert_gate_up(gate, up);
      SE_ASSIGN_OR_RETURN(l.experts_down, table.get(p + "mlp.experts.down_proj.weight", {experts, hidden, inter}));
      if (const int64_t shared = c.shared_expert_intermediate_size; shared > 0) {
        SE_ASSIGN_OR_RETURN(Tensor shared_gate, table.get(p + "mlp.shared_experts.gate_proj.weight", {shared, hidden}));
        SE_ASSIGN_OR_RETURN(Tensor shared_up, table.get(p + "mlp.shared_experts.up_proj.weight", {shared, hidden}));
        l.shared_gate_up = concat_rows({shared_gate, shared_up});
        SE_ASSIGN_OR_RETURN(l.shared_down, table.get(p + "mlp.shared_experts.down_proj.weight", {hidden, shared}));
      }
      continue;
    }
    SE_ASSIGN_OR_RETURN(Tensor gate, table.get(p + "mlp.gate_proj.weight", {c.intermediate_size, hidden}));
    SE_ASSIGN_OR_RETURN(Tensor up, table.get(p + "mlp.up_proj.weight", {c.intermediate_size, hidden}));
    l.gate_up = concat_rows({gate, up});
    SE_ASSIGN_OR_RETURN(l.down, table.get(p + "mlp.down_proj.weight", {hidden, c.intermediate_size}));
  }
  return w;
}

}  // namespace se
