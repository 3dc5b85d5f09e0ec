#include "model/forward_workspace.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "backend/step_graph.h"

namespace se {

TensorView ForwardWorkspace::rows(const Tensor& buffer, int64_t n) {
  TensorView v = buffer.view();
  v.shape[0] = n;
  return v;
}

TensorView ForwardWorkspace::rows_of_width(const Tensor& buffer, int64_t n, int64_t width) {
  return TensorView{buffer.raw(), buffer.dtype(), {n, width}, buffer.device()};
}

TensorView ForwardWorkspace::gate_up(int64_t t) const {
  return rows_of_width(gate_up_, t, 2 * config_.intermediate_size);
}
TensorView ForwardWorkspace::act(int64_t t) const { return rows_of_width(act_, t, config_.intermediate_size); }
TensorView ForwardWorkspace::expert_offsets(int layer) const {
  const int64_t width = int64_t{config_.num_experts} + 1;
  return TensorView{expert_offsets_.data<int32_t>() + layer * width, DType::kI32, {width}, device_};
}
TensorView ForwardWorkspace::expert_rows(int64_t t) const {
  return TensorView{expert_rows_.raw(), DType::kI32, {t * config_.num_experts_per_tok}, device_};
}
TensorView ForwardWorkspace::expert_slots(int64_t t) const {
  return TensorView{expert_slots_.raw(), DType::kI32, {t * config_.num_experts_per_tok}, device_};
}
TensorView ForwardWorkspace::expert_in(int64_t t) const {
  return rows_of_width(expert_in_, t * config_.num_experts_per_tok, config_.hidden_size);
}
TensorView ForwardWorkspace::expert_gate_up(int64_t t) const {
  return rows_of_width(expert_gate_up_, t * config_.num_experts_per_tok, 2 * config_.moe_intermediate_size);
}
TensorView ForwardWorkspace::expert_act(int64_t t) const {
  return rows_of_width(expert_act_, t * config_.num_experts_per_tok, config_.moe_intermediate_size);
}
TensorView ForwardWorkspace::expert_out(int64_t t) const {
  return rows_of_width(expert_out_, t * config_.num_experts_per_tok, config_.hidden_size);
}

TensorView ForwardWorkspace::shared_expert_gate_up(int64_t t) const {
  return rows_of_width(gate_up_, t, 2 * config_.shared_expert_intermediate_size);
}
TensorView ForwardWorkspace::shared_expert_act(int64_t t) const {
  return rows_of_width(act_, t, config_.shared_expert_intermediate_size);
}

TensorView ForwardWorkspace::vocab_shard_logits(int64_t r) const {
  return TensorView{
      vocab_shard_logits_.raw(), DType::kF32, {config_.shard.size, r, config_.vocab_shard_rows()}, device_};
}

TensorView ForwardWorkspace::i32_rows(int64_t offset, int64_t n) const {
  return TensorView{inputs_.data<int32_t>() + offset, DType::kI32, {n}, device_};
}

TensorView ForwardWorkspace::qkv(int64_t t) const {
  return TensorView{qkv_.raw(), DType::kF32, {t, config_.q_size() + 2 * config_.kv_size()}, device_};
}

Tensor ForwardWorkspace::buffer(DType dtype, Shape shape) const { return empty_on(device_, dtype, shape); }

Shape ForwardWorkspace::BufferSpec::shape_for(int64_t num_tokens, int64_t num_logit_rows) const {
  Shape s = shape;
  if (!fixed) s[0] = per_logit_row ? num_logit_rows : num_tokens;
  return s;
}

std::vector<ForwardWorkspace::BufferSpec> ForwardWorkspace::buffer_specs(const ModelConfig& c, DType matmul_dtype) {
  const int64_t hidden = c.hidden_size, heads = c.num_heads, kv_heads = c.num_kv_heads, head_dim = c.head_dim;
  // The dense MLP and the shared experts' share the gate_up and act buffers (the routed experts have their own).
  const int64_t intermediate = std::max(c.intermediate_size, c.shared_expert_intermediate_size);
  std::vector<BufferSpec> specs = {
      {&ForwardWorkspace::hidden_, DType::kF32, {0, hidden}},
      {&ForwardWorkspace::normed_, matmul_dtype, {0, hidden}},
      {&ForwardWorkspace::q_, DType::kF32, {0, heads, head_dim}},
      {&ForwardWorkspace::k_, DType::kF32, {0, kv_heads, head_dim}},
      {&ForwardWorkspace::v_, DType::kF32, {0, kv_heads, head_dim}},
      {&ForwardWorkspace::attn_, matmul_dtype, {0, heads, head_dim}},
      {&ForwardWorkspace::proj_, DType::kF32, {0, hidden}},
      {&ForwardWorkspace::gate_up_, DType::kF32, {0, 2 * intermediate}},
      {&ForwardWorkspace::act_, matmul_dtype, {0, intermediate}},
      {&ForwardWorkspace::last_, DType::kF32, {0, hidden}, true},
      {&ForwardWorkspace::last_normed_, matmul_dtype, {0, hidden}, true},
      {&ForwardWorkspace::logits_, DType::kF32, {0, int64_t{c.vocab_size}}, true},
  };
  if (c.shard.size > 1) {
    specs.push_back(
        {&ForwardWorkspace::vocab_shard_logits_, DType::kF32, {0, int64_t{c.shard.size} * c.vocab_shard_rows()}, true});
  }
  if (c.num_experts > 0) {
    const int64_t k = c.num_experts_per_tok;
    specs.push_back({&ForwardWorkspace::router_logits_, DType::kF32, {0, int64_t{c.num_experts}}});
    specs.push_back({&ForwardWorkspace::expert_ids_, DType::kI32, {0, k}});
    specs.push_back({&ForwardWorkspace::expert_weights_, DType::kF32, {0, k}});
    const int64_t inter = c.moe_intermediate_size;
    specs.push_back({&ForwardWorkspace::expert_offsets_,
                     DType::kI32,
                     {int64_t{c.num_layers}, int64_t{c.num_experts} + 1},
                     false,
                     true});
    specs.push_back({&ForwardWorkspace::expert_rows_, DType::kI32, {0, k}});
    specs.push_back({&ForwardWorkspace::expert_slots_, DType::kI32, {0, k}});
    specs.push_back({&ForwardWorkspace::expert_in_, matmul_dtype, {0, k * hidden}});
    specs.push_back({&ForwardWorkspace::expert_gate_up_, DType::kF32, {0, k * 2 * inter}});
    specs.push_back({&ForwardWorkspace::expert_act_, matmul_dtype, {0, k * inter}});
    specs.push_back({&ForwardWorkspace::expert_out_, DType::kF32, {0, k * hidden}});
  }
  if (c.latent_attention()) {
    const int64_t rope = c.qk_rope_head_dim;
    if (c.q_lora_rank > 0) specs.push_back({&ForwardWorkspace::q_latent_, matmul_dtype, {0, int64_t{c.q_lora_rank}}});
    specs.push_back({&ForwardWorkspace::q_proj_, DType::kF32, {0, heads * head_dim}});
    specs.push_back({&ForwardWorkspace::kv_a_, DType::kF32, {0, c.kv_lora_rank + rope}});
    specs.push_back({&ForwardWorkspace::kv_latent_, matmul_dtype, {0, int64_t{c.kv_lora_rank}}});
    specs.push_back({&ForwardWorkspace::kv_b_, DType::kF32, {0, heads * (c.qk_nope_head_dim + c.v_head_dim)}});
    specs.push_back({&ForwardWorkspace::latent_rows_, DType::kF32, {0, 1, c.kv_lora_rank + rope}});
    specs.push_back({&ForwardWorkspace::q_absorbed_, DType::kF32, {0, heads, c.kv_lora_rank + rope}});
  }
  // The fused QKV projection shares gate_up_ when that is wide enough.
  if (const int64_t qkv_width = c.q_size() + 2 * c.kv_size(); qkv_width > 2 * intermediate)
    specs.push_back({&ForwardWorkspace::qkv_, DType::kF32, {0, qkv_width}});
  return specs;
}

void ForwardWorkspace::reserve(int32_t num_tokens, int32_t num_logit_rows) {
  if (num_tokens <= capacity_tokens_ && num_logit_rows <= capacity_logit_rows_) return;
  const int64_t t = std::max(num_tokens, capacity_tokens_);
  const int64_t r = std::max({num_logit_rows, capacity_logit_rows_, 1});
  const ModelConfig& c = config_;
  // Drop the old buffers first so the device never holds two generations at once.
  *this = ForwardWorkspace(c, device_, matmul_dtype_);
  StepGraph::note_buffers_moved();  // every buffer address changed
  inputs_ = buffer(DType::kI32, {2 * t + r});
  for (const BufferSpec& spec : buffer_specs(c, matmul_dtype_))
    this->*spec.tensor = buffer(spec.dtype, spec.shape_for(t, r));
  if (qkv_.raw() == nullptr) qkv_ = gate_up_;
  capacity_tokens_ = static_cast<int32_t>(t);
  capacity_logit_rows_ = static_cast<int32_t>(r);
}

int64_t ForwardWorkspace::bytes_for(const ModelConfig& c, DType matmul_dtype, int32_t num_tokens,
                                    int32_t num_logit_rows) {
  const int64_t t = num_tokens, r = std::max(num_logit_rows, 1);
  int64_t bytes = static_cast<int64_t>(sizeof(int32_t)) * (2 * t + r);  // inputs_
  for (const BufferSpec& spec : buffer_specs(c, matmul_dtype))
    bytes += spec.shape_for(t, r).numel() * static_cast<int64_t>(dtype_size(spec.dtype));
  return bytes;
}

void ForwardWorkspace::upload_inputs(const ForwardBatch& batch) {
  const int32_t t = batch.num_tokens();
  const auto r = static_cast<int32_t>(batch.logit_rows.size());
  reserve(t, r);
  host_inputs_.resize(inputs_.numel());
  std::copy(batch.token_ids.begin(), batch.token_ids.end(), host_inputs_.begin());
  std::copy(batch.positions.begin(), batch.positions.end(), host_inputs_.begin() + capacity_tokens_);
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), host_inputs_.begin() + 2 * capacity_tokens_);
  copy_bytes(device_, inputs_.raw(), host_inputs_.data(), host_inputs_.size() * sizeof(int32_t));
}

}  // namespace se
