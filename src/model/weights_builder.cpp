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
    : device_(device), matrix_dtype_(matrix_dtype), keep_fp8_experts_(device != Device::kCpu) {}

void ModelWeightsBuilder::add(const std::string& name, Tensor& field, Shape field_shape, Shape shape, bool matrix,
                              Placement placement, int64_t first_row_or_half, bool required, Tensor* scale_field) {
  slots_.emplace(name, Slot{&field, scale_field, field_shape, shape, matrix, placement, first_row_or_half, required});
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
          Placement::kExpertHalf, 0, true, &l.experts_gate_up_scale);
      add(p + "mlp.experts.up_proj.weight", l.experts_gate_up, stacked, {experts, inter, hidden}, true,
          Placement::kExpertHalf, 1, true, &l.experts_gate_up_scale);
      add(p + "mlp.experts.down_proj.weight", l.experts_down, {experts, hidden, inter}, {experts, hidden, inter}, true,
          Placement::kWhole, 0, true, &l.experts_down_scale);
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

Result<ModelWeightsBuilder::Slot*> ModelWeightsBuilder::receive(const std::string& name, int64_t numel) {
  auto it = slots_.find(name);
  if (it == slots_.end()) return invalid_argument("weights: the model has no tensor '{}'", name);
  Slot& slot = it->second;
  if (slot.received) return invalid_argument("weights: tensor '{}' given twice", name);
  if (numel != slot.shape.numel()) {
    return invalid_argument("weights: tensor '{}' has {} elements, expected shape {}", name, numel,
                            slot.shape.to_string());
  }
  slot.received = true;
  return &slot;
}

void ModelWeightsBuilder::copy_into(const Slot& slot, Tensor& field, DType dtype, const Shape& field_shape,
                                    const Tensor& part) {
  if (!field.defined()) field = empty_on(device_, dtype, field_shape);
  auto* dst = static_cast<char*>(field.raw());
  const auto* src = static_cast<const char*>(part.raw());
  switch (slot.placement) {
    case Placement::kWhole:
      copy_bytes(device_, dst, src, part.nbytes());
      break;
    case Placement::kRows: {
      const size_t row_bytes = field.nbytes() / static_cast<size_t>(field_shape[0]);
      copy_bytes(device_, dst + static_cast<size_t>(slot.first_row_or_half) * row_bytes, src, part.nbytes());
      break;
    }
    case Placement::kExpertHalf: {
      const int64_t experts = slot.shape[0];
      const size_t block = part.nbytes() / static_cast<size_t>(experts);
      for (int64_t e = 0; e < experts; ++e) {
        copy_bytes(device_, dst + static_cast<size_t>(2 * e + slot.first_row_or_half) * block,
                   src + static_cast<size_t>(e) * block, block);
      }
      break;
    }
  }
}

Status ModelWeightsBuilder::place(const std::string& name, Tensor tensor) {
  SE_ASSIGN_OR_RETURN(Slot * slot, receive(name, tensor.numel()));
  if (slot->field->defined() && slot->field->dtype() == DType::kU8)
    return invalid_argument("weights: tensor '{}' is not FP8 but the rest of its matrix is", name);
  const DType dtype = slot->matrix ? matrix_dtype_ : DType::kF32;
  Tensor host = host_as(tensor, dtype);
  tensor = Tensor();  // one host copy at a time
  if (slot->placement == Placement::kWhole && device_ == Device::kCpu) {
    *slot->field = host.reshape(slot->field_shape);
    return Status::ok();
  }
  copy_into(*slot, *slot->field, dtype, slot->field_shape, host);
  return Status::ok();
}

bool ModelWeightsBuilder::keeps_fp8(const WeightSpec& spec, const Fp8BlockQuantization& q) const {
  auto it = slots_.find(spec.name);
  if (!keep_fp8_experts_ || it == slots_.end() || it->second.scale_field == nullptr) return false;
  const Shape& shape = it->second.shape;  // [experts, rows, cols]
  return q.block_rows % 32 == 0 && q.block_cols % 32 == 0 && shape[1] % q.block_rows == 0 &&
         shape[2] % q.block_cols == 0;
}

Status ModelWeightsBuilder::put_fp8(const WeightSpec& spec, Fp8BlockWeight&& weight) {
  SE_ASSIGN_OR_RETURN(Slot * slot, receive(spec.name, weight.codes.numel()));
  if (slot->scale_field == nullptr) return invalid_argument("weights: tensor '{}' cannot be kept in FP8", spec.name);
  if (slot->field->defined() && slot->field->dtype() != DType::kU8)
    return invalid_argument("weights: tensor '{}' is FP8 but the rest of its matrix is not", spec.name);
  const Shape& scale = weight.scale_inv.shape();  // [experts, rows / block_rows, cols / block_cols]
  const int64_t halves = slot->field_shape[1] / slot->shape[1];
  copy_into(*slot, *slot->field, DType::kU8, slot->field_shape, weight.codes);
  weight.codes = Tensor();
  copy_into(*slot, *slot->scale_field, DType::kF32, {scale[0], halves * scale[1], scale[2]},
            host_as(weight.scale_inv, DType::kF32));
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
