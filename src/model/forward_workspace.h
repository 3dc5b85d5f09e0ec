// ForwardWorkspace: the activation buffers of a model's forward on its device (Model::make_workspace), owned by
// whoever drives the forwards and allocated once for up to
// `num_tokens` batch rows and `num_logit_rows` sampled rows and reused by every layer and step (no allocation
// inside the decode loop). Buffers hold fp32 except the matmul inputs, which take the weights' dtype (BF16 on
// CUDA, where cuBLASLt reads bf16 operands). The batch's token ids, positions and logit rows travel to the device
// in one copy per forward. Growing (a batch over the reserved capacity) reallocates every buffer.
// NOTE: buffer addresses change only in reserve(), so a captured CUDA graph per batch-size bucket stays valid
// as long as the workspace was reserved for the largest bucket before capture.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/forward_batch.h"
#include "tensor/tensor.h"

namespace se {

class ForwardWorkspace final {
 public:
  ForwardWorkspace(const ModelConfig& config, Device device, DType matmul_dtype)
      : config_(config), device_(device), matmul_dtype_(matmul_dtype) {}

  // Makes room for a batch of `num_tokens` rows and `num_logit_rows` sampled rows (a no-op when it fits).
  void reserve(int32_t num_tokens, int32_t num_logit_rows);
  // Bytes reserve(num_tokens, num_logit_rows) allocates from nothing (the same buffer list, so never out of step).
  static int64_t bytes_for(const ModelConfig& config, DType matmul_dtype, int32_t num_tokens, int32_t num_logit_rows);
  // Copies the batch's token ids, positions and logit rows to the device (reserving room first).
  void upload_inputs(const ForwardBatch& batch);

  Device device() const { return device_; }
  DType matmul_dtype() const { return matmul_dtype_; }
  int32_t capacity_tokens() const { return capacity_tokens_; }

  // Views of the first rows of each buffer for the current batch; `t` batch rows, `r` logit rows.
  TensorView token_ids(int64_t t) const { return i32_rows(0, t); }                           // [t]
  TensorView positions(int64_t t) const { return i32_rows(capacity_tokens_, t); }            // [t]
  TensorView logit_rows(int64_t r) const { return i32_rows(2 * int64_t{capacity_tokens_}, r); }  // [r]
  TensorView hidden(int64_t t) const { return rows(hidden_, t); }       // [t, hidden] residual stream, F32
  TensorView normed(int64_t t) const { return rows(normed_, t); }       // [t, hidden] matmul input
  // [t, q_size + 2 * kv_size] F32: the fused QKV projection before split_qkv_rope. It lives in the gate_up
  // buffer, which nothing reads until the MLP.
  TensorView qkv(int64_t t) const;
  TensorView q(int64_t t) const { return rows(q_, t); }                 // [t, num_heads, head_dim] F32
  TensorView k(int64_t t) const { return rows(k_, t); }                 // [t, num_kv_heads, head_dim] F32
  TensorView v(int64_t t) const { return rows(v_, t); }                 // [t, num_kv_heads, head_dim] F32
  TensorView attn(int64_t t) const { return rows(attn_, t); }           // [t, num_heads, head_dim] matmul input
  TensorView proj(int64_t t) const { return rows(proj_, t); }           // [t, hidden] F32: o_proj, then down
  TensorView gate_up(int64_t t) const;                                  // [t, 2 * intermediate] F32
  TensorView act(int64_t t) const;                                      // [t, intermediate] matmul input
  // The mixture of experts (models with num_experts > 0): the router's choice for each of the `t` batch rows, and
  // the t * experts_per_tok (row, expert) pairs grouped by expert (backend/moe_ops.h).
  TensorView router_logits(int64_t t) const { return rows(router_logits_, t); }    // [t, num_experts] F32
  TensorView expert_ids(int64_t t) const { return rows(expert_ids_, t); }          // [t, experts_per_tok] I32
  TensorView expert_weights(int64_t t) const { return rows(expert_weights_, t); }  // [t, experts_per_tok] F32
  // [num_experts + 1] I32, MoE layer `layer`'s own, kept after the forward: which experts the step read.
  TensorView expert_offsets(int layer) const;
  TensorView all_expert_offsets() const { return expert_offsets_.view(); }  // [num_layers, num_experts + 1] I32
  TensorView expert_rows(int64_t t) const;            // [t * experts_per_tok] I32: the batch row of each grouped row
  TensorView expert_slots(int64_t t) const;           // [t * experts_per_tok] I32: the grouped row of each pair
  TensorView expert_in(int64_t t) const;              // [t * experts_per_tok, hidden] matmul input
  TensorView expert_gate_up(int64_t t) const;         // [t * experts_per_tok, 2 * moe_intermediate] F32
  TensorView expert_act(int64_t t) const;             // [t * experts_per_tok, moe_intermediate] matmul input
  TensorView expert_out(int64_t t) const;             // [t * experts_per_tok, hidden] F32
  TensorView shared_expert_gate_up(int64_t t) const;  // [t, 2 * shared_expert_intermediate] F32
  TensorView shared_expert_act(int64_t t) const;      // [t, shared_expert_intermediate] matmul input
  // Multi-head latent attention (ModelConfig::latent_attention).
  TensorView q_latent(int64_t t) const { return rows(q_latent_, t); }        // [t, q_lora_rank] matmul input
  TensorView q_proj(int64_t t) const { return rows(q_proj_, t); }            // [t, heads * head_dim] F32, as projected
  TensorView kv_a(int64_t t) const { return rows(kv_a_, t); }                // [t, kv_lora_rank + qk_rope] F32
  TensorView kv_latent(int64_t t) const { return rows(kv_latent_, t); }      // [t, kv_lora_rank] matmul input
  TensorView kv_b(int64_t t) const { return rows(kv_b_, t); }                // [t, heads * (qk_nope + v_head)] F32
  TensorView latent_rows(int64_t t) const { return rows(latent_rows_, t); }  // [t, 1, kv_lora_rank + qk_rope] F32
  TensorView q_absorbed(int64_t t) const { return rows(q_absorbed_, t); }    // [t, heads, kv_lora_rank + qk_rope] F32
  TensorView last(int64_t r) const { return rows(last_, r); }           // [r, hidden] F32 gathered rows
  TensorView last_normed(int64_t r) const { return rows(last_normed_, r); }  // [r, hidden] matmul input
  Tensor logits(int64_t r) const { return logits_.slice_rows(0, r); }   // [r, vocab] F32
  // A tensor-parallel rank's head (config.shard.size > 1): every rank's logits of its vocabulary rows, gathered.
  TensorView vocab_shard_logits(int64_t r) const;  // [shard.size, r, vocab_shard_rows] F32

 private:
  // One activation buffer: a row per batch token, or per sampled row, each row shaped like `shape` after its
  // leading dimension (which the row count replaces).
  struct BufferSpec {
    Tensor ForwardWorkspace::*tensor;
    DType dtype;
    Shape shape;
    bool per_logit_row = false;
    bool fixed = false;  // `shape` as it is, whatever the batch
    Shape shape_for(int64_t num_tokens, int64_t num_logit_rows) const;
  };
  // Every buffer besides the inputs, for reserve() to allocate and bytes_for() to count.
  static std::vector<BufferSpec> buffer_specs(const ModelConfig& config, DType matmul_dtype);
  static TensorView rows(const Tensor& buffer, int64_t n);
  // The first n rows of `buffer` read as rows of `width` elements (a buffer shared by layers of two widths).
  static TensorView rows_of_width(const Tensor& buffer, int64_t n, int64_t width);
  TensorView i32_rows(int64_t offset, int64_t n) const;
  Tensor buffer(DType dtype, Shape shape) const;

  ModelConfig config_;
  Device device_;
  DType matmul_dtype_;
  int32_t capacity_tokens_ = 0;
  int32_t capacity_logit_rows_ = 0;
  std::vector<int32_t> host_inputs_;  // staging of the one input copy
  Tensor inputs_;                      // [2 * capacity_tokens + capacity_logit_rows] I32
  Tensor hidden_, normed_, q_, k_, v_, attn_, proj_, gate_up_, act_, last_, last_normed_, logits_;
  Tensor vocab_shard_logits_;  // tensor-parallel ranks only
  Tensor qkv_;  // gate_up_ itself when it is wide enough
  // MoE models only:
  Tensor router_logits_, expert_ids_, expert_weights_, expert_offsets_, expert_rows_, expert_slots_, expert_in_,
      expert_gate_up_, expert_act_, expert_out_;
  Tensor q_latent_, q_proj_, kv_a_, kv_latent_, kv_b_, latent_rows_,
      q_absorbed_;  // latent-attention models only
};

}  // namespace se
