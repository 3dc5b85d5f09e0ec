#include "model/weights_builder.h"

#include <algorithm>

#include <fmt/format.h>

#include "backend/device_memory.h"

namespace se {

namespace {

// `t` (F32/F16/BF16) as a host tensor of `dtype`: `t` itself when it already is.
Tensor host_as(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor f32 = t.dtype() == DType::kF32 ? t : t.to_f32();
  if (dtype == DType::kF32) return f32;
  Tensor out = Tensor::empty(dtype, t.shape());
  // In blocks across threads: an 8B model converts 8G elements here.
  constexpr int64_t kBlock = int64_t{1} << 20;
  const int64_t num_blocks = (t.numel() + kBlock - 1) / kBlock;
  const size_t elem = dtype_size(dtype);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * kBlock;
    convert_from_f32(f32.data<float>() + begin, static_cast<char*>(out.raw()) + static_cast<size_t>(begin) * elem,
                     dtype, static_cast<size_t>(std::min(kBlock, t.numel() - begin)));
  }
  return out;
}

}  // namespace

DType matrix_dtype(Device device) { return device == Device::kCpu ? DType::kF32 : DType::kBF16; }

ModelWeightsBuilder::ModelWeightsBuilder(Device device, DType matrix_dtype)
    : device_(device), matrix_dtype_(matrix_dtype) {}

void ModelWeightsBuilder::add(const std::string& name, Tensor& field, Shape field_shape, Shape shape, bool matrix,
                              Placement placement, int64_t first_row_or_half, bool required) {
  slots_.emplace(name, Slot{&field, field_shape, shape, matrix, placement, first_row_or_half, required});
  order_.push_back(name);
}

Status ModelWeightsBuilder::begin(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size;
  weights_ = ModelWeights();
  slots_.clear();
  order_.clear();
  // A tensor-parallel rank holds its part of the vocabulary (tensor_parallel.h); otherwise all of it.
  const int64_t vocab_rows = c.vocab_shard_rows();
  add_whole("model.embed_tokens.weight", weights_.embed_tokens, {vocab_rows, hidden}, true);
  // Tied, or an untied config whose checkpoint has no head: the head is the embedding table (finish()).
  if (!c.tie_word_embeddings)
    add_whole("lm_head.weight", weights_.lm_head, {vocab_rows, hidden}, true, /*required=*/false);
  add_whole("model.norm.weight", weights_.final_norm, {hidden}, false);
  // Sized once: the slots point into the layers.
  weights_.layers.resize(static_cast<size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = weights_.layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("model.layers.{}.", i);
    add_whole(p + "input_layernorm.weight", l.input_norm, {hidden}, false);
    if (c.latent_attention()) {
      // Multi-head latent attention (names as DeepSeek-V2's checkpoints give them).
      const int64_t heads = c.num_heads, rope = c.qk_rope_head_dim;
      const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : hidden;
      if (c.q_lora_rank > 0) {
        add_whole(p + "self_attn.q_a_proj.weight", l.q_a, {c.q_lora_rank, hidden}, true);
        add_whole(p + "self_attn.q_a_layernorm.weight", l.q_a_norm, {c.q_lora_rank}, false);
        add_whole(p + "self_attn.q_b_proj.weight", l.q_proj, {heads * c.head_dim, q_in}, true);
      } else {
        add_whole(p + "self_attn.q_proj.weight", l.q_proj, {heads * c.head_dim, q_in}, true);
      }
      add_whole(p + "self_attn.kv_a_proj_with_mqa.weight", l.kv_a, {c.kv_lora_rank + rope, hidden}, true);
      add_whole(p + "self_attn.kv_a_layernorm.weight", l.kv_a_norm, {c.kv_lora_rank}, false);
      add_whole(p + "self_attn.kv_b_proj.weight", l.kv_b, {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
                true);
      add_whole(p + "self_attn.o_proj.weight", l.o_proj, {hidden, heads * c.v_head_dim}, true);
    } else {
      // q, k and v stacked into one matrix, as are their biases.
      const int64_t q = c.q_size(), kv = c.kv_size(), qkv = q + 2 * kv;
      add(p + "self_attn.q_proj.weight", l.qkv, {qkv, hidden}, {q, hidden}, true, Placement::kRows, 0);
      add(p + "self_attn.k_proj.weight", l.qkv, {qkv, hidden}, {kv, hidden}, true, Placement::kRows, q);
      add(p + "self_attn.v_proj.weight", l.qkv, {qkv, hidden}, {kv, hidden}, true, Placement::kRows, q + kv);
      if (c.attention_bias) {
        add(p + "self_attn.q_proj.bias", l.qkv_bias, {qkv}, {q}, false, Placement::kRows, 0);
        add(p + "self_attn.k_proj.bias", l.qkv_bias, {qkv}, {kv}, false, Placement::kRows, q);
        add(p + "self_attn.v_proj.bias", l.qkv_bias, {qkv}, {kv}, false, Placement::kRows, q + kv);
      }
      if (c.qk_norm) {
        add_whole(p + "self_attn.q_norm.weight", l.q_norm, {c.head_dim}, false);
        add_whole(p + "self_attn.k_norm.weight", l.k_norm, {c.head_dim}, false);
      }
      add_whole(p + "self_attn.o_proj.weight", l.o_proj, {hidden, q}, true);
    }
    add_whole(p + "post_attention_layernorm.weight", l.post_attention_norm, {hidden}, false);
    if (c.sandwich_norm) {
      add_whole(p + "pre_feedforward_layernorm.weight", l.pre_feedforward_norm, {hidden}, false);
      add_whole(p + "post_feedforward_layernorm.weight", l.post_feedforward_norm, {hidden}, false);
    }
    if (c.layers[static_cast<size_t>(i)].moe) {
      const int64_t experts = c.num_experts, inter = c.moe_intermediate_size;
      add_whole(p + "mlp.gate.weight", l.router, {experts, hidden}, true);
      // Each expert's gate rows, then its up rows, so one GEMM per expert computes both.
      const Shape stacked{experts, 2 * inter, hidden};
      add(p + "mlp.experts.gate_proj.weight", l.experts_gate_up, stacked, {experts, inter, hidden}, true,
          Placement::kExpertHalf, 0);
      add(p + "mlp.experts.up_proj.weight", l.experts_gate_up, stacked, {experts, inter, hidden}, true,
          Placement::kExpertHalf, 1);
      add_whole(p + "mlp.experts.down_proj.weight", l.experts_down, {experts, hidden, inter}, true);
      if (const int64_t shared = c.shared_expert_intermediate_size; shared > 0) {
        add(p + "mlp.shared_experts.gate_proj.weight", l.shared_gate_up, {2 * shared, hidden}, {shared, hidden}, true,
            Placement::kRows, 0);
        add(p + "mlp.shared_experts.up_proj.weight", l.shared_gate_up, {2 * shared, hidden}, {shared, hidden}, true,
            Placement::kRows, shared);
        add_whole(p + "mlp.shared_experts.down_proj.weight", l.shared_down, {hidden, shared}, true);
      }
      continue;
    }
    const int64_t inter = c.intermediate_size;
    add(p + "mlp.gate_proj.weight", l.gate_up, {2 * inter, hidden}, {inter, hidden}, true, Placement::kRows, 0);
    add(p + "mlp.up_proj.weight", l.gate_up, {2 * inter, hidden}, {inter, hidden}, true, Placement::kRows, inter);
    add_whole(p + "mlp.down_proj.weight", l.down, {hidden, inter}, true);
  }
  return Status::ok();
}

Status ModelWeightsBuilder::place(const std::string& name, Tensor tensor) {
  auto it = slots_.find(name);
  if (it == slots_.end()) return invalid_argument("weights: the model has no tensor '{}'", name);
  Slot& slot = it->second;
  if (slot.received) return invalid_argument("weights: tensor '{}' given twice", name);
  if (tensor.numel() != slot.shape.numel()) {
    return invalid_argument("weights: tensor '{}' has shape {}, expected {}", name, tensor.shape().to_string(),
                            slot.shape.to_string());
  }
  slot.received = true;
  const DType dtype = slot.matrix ? matrix_dtype_ : DType::kF32;
  Tensor host = host_as(tensor, dtype);
  tensor = Tensor();  // one host copy at a time
  if (slot.placement == Placement::kWhole && device_ == Device::kCpu) {
    *slot.field = host.reshape(slot.field_shape);
    return Status::ok();
  }
  if (!slot.field->defined()) *slot.field = empty_on(device_, dtype, slot.field_shape);
  auto* dst = static_cast<char*>(slot.field->raw());
  const auto* src = static_cast<const char*>(host.raw());
  switch (slot.placement) {
    case Placement::kWhole:
      copy_bytes(device_, dst, src, host.nbytes());
      break;
    case Placement::kRows: {
      const size_t row_bytes = slot.field->nbytes() / static_cast<size_t>(slot.field_shape[0]);
      copy_bytes(device_, dst + static_cast<size_t>(slot.first_row_or_half) * row_bytes, src, host.nbytes());
      break;
    }
    case Placement::kExpertHalf: {
      const int64_t experts = slot.shape[0];
      const size_t block = host.nbytes() / static_cast<size_t>(experts);
      for (int64_t e = 0; e < experts; ++e) {
        copy_bytes(device_, dst + static_cast<size_t>(2 * e + slot.first_row_or_half) * block,
                   src + static_cast<size_t>(e) * block, block);
      }
      break;
    }
  }
  return Status::ok();
}

Status ModelWeightsBuilder::put_all(const std::map<std::string, Tensor>& tensors) {
  for (const std::string& name : order_) {
    if (auto it = tensors.find(name); it != tensors.end()) SE_RETURN_IF_ERROR(place(name, it->second));
  }
  return Status::ok();
}

Result<ModelWeights> ModelWeightsBuilder::finish() {
  for (const std::string& name : order_) {
    const Slot& slot = slots_.at(name);
    if (slot.required && !slot.received) return not_found("weights: missing tensor '{}'", name);
  }
  if (!weights_.lm_head.defined()) weights_.lm_head = weights_.embed_tokens;
  slots_.clear();
  order_.clear();
  return std::move(weights_);
}

}  // namespace se
