// ModelWeights: the tensors of a decoder model in the layout the forward uses, on the device that runs it: q/k/v
// and gate/up projections are stacked into single matrices (one allocation each; the forward multiplies by row
// ranges), and so are each expert's gate/up projections. The matrices are fp32 on the CPU and BF16 on CUDA (what
// cuBLASLt multiplies), norms and biases fp32. Built weight by weight by ModelWeightsBuilder (weights_builder.h).
// Owns its tensors (on the CPU shared with the loader's where no copies were needed). Immutable once built.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace se {

struct LayerWeights {
  Tensor input_norm;           // [hidden]
  Tensor qkv;                  // [q_size + 2 * kv_size, hidden]
  Tensor qkv_bias;             // [q_size + 2 * kv_size] or undefined
  Tensor q_norm;               // [head_dim] or undefined
  Tensor k_norm;               // [head_dim] or undefined
  Tensor o_proj;               // [hidden, q_size]
  Tensor post_attention_norm;  // [hidden]: pre-MLP norm (Llama), post-attention norm (Gemma sandwich)
  Tensor pre_feedforward_norm;   // [hidden] (sandwich only)
  Tensor post_feedforward_norm;  // [hidden] (sandwich only)
  Tensor gate_up;                // [2 * intermediate, hidden]: gate rows first (dense MLP layers)
  Tensor down;                   // [hidden, intermediate] (dense MLP layers)
  // Mixture-of-experts layers (LayerConfig::moe) instead of gate_up / down:
  Tensor router;           // [num_experts, hidden]
  Tensor experts_gate_up;  // [num_experts, 2 * moe_intermediate, hidden]: each expert's gate rows first
  Tensor experts_down;     // [num_experts, hidden, moe_intermediate]
  // Kept as block-scaled FP8 (a GPU load of an FP8 checkpoint): the two above hold e4m3 codes (U8) and these their
  // fp32 block scales [num_experts, rows / block_rows, cols / block_cols] (backend/moe_ops.h); else undefined.
  Tensor experts_gate_up_scale;
  Tensor experts_down_scale;
  Tensor shared_gate_up;  // [2 * shared_expert_intermediate, hidden] or undefined: the always-on experts
  Tensor shared_down;     // [hidden, shared_expert_intermediate] or undefined
  // Multi-head latent attention (ModelConfig::latent_attention) instead of qkv / qkv_bias / q_norm / k_norm; o_proj
  // is then [hidden, num_heads * v_head_dim]. Rows as the checkpoint stores them (RoPE pairs interleaved).
  Tensor q_a;        // [q_lora_rank, hidden] or undefined (no query latent)
  Tensor q_a_norm;   // [q_lora_rank] or undefined
  Tensor q_proj;     // [num_heads * (qk_nope + qk_rope), q_lora_rank or hidden]: each head's nope rows, then rope
  Tensor kv_a;       // [kv_lora_rank + qk_rope, hidden]: the latent rows, then the shared RoPE key's
  Tensor kv_a_norm;  // [kv_lora_rank]
  Tensor kv_b;       // [num_heads * (qk_nope + v_head_dim), kv_lora_rank]: each head's k_nope rows, then its v rows
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;    // [hidden]
  Tensor lm_head;       // [vocab, hidden]; the embedding table when tied

  // The dtype of the matrices, which the forward's matmul inputs take too.
  DType matmul_dtype() const { return embed_tokens.dtype(); }
};

}  // namespace se
