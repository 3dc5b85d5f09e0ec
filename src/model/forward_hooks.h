// ForwardHooks: the boundaries the model exposes while it runs its modules in native order. The model calls
// attend() once per layer with the batch's new q/k/v after RoPE (the hooks' owner stores k/v, decides what
// attention reads and writes the output) and on_layer_end() after the layer's MLP. The model never sees
// pages, selections or methods; the sparse controller implements these hooks (sparse/sparse_controller.h).
// A mixture-of-experts layer reports which experts each token was routed to (on_expert_choice), so an observer
// can count the expert weights a step reads.
#pragma once

#include "backend/ops.h"
#include "base/check.h"
#include "model/config.h"
#include "model/forward_batch.h"

namespace se {

class ForwardHooks {
 public:
  virtual ~ForwardHooks() = default;

  // Before the first layer of each forward (the hooks may prepare what every layer of it reads).
  virtual void begin_forward(const ForwardBatch& /*batch*/) {}
  // q, out [T, H, D]; k, v [T, Hkv, D]: rows of `batch` on the model's device. q, k, v are F32; out is F32 on
  // the CPU and the model's matmul dtype (BF16) on CUDA.
  virtual void attend(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q,
                      TensorView k, TensorView v, TensorView out, const AttentionParams& params) = 0;
  // Multi-head latent attention (model/layers/latent_attention.h) hands over its shared latent instead of expanded
  // per-head K/V when the hooks' owner keeps a shared-latent store (KvStoreKind::kSharedLatent); else it calls attend()
  // with the expanded heads.
  virtual bool stores_latent() const { return false; }
  // latent [T, 1, kv_lora_rank + qk_rope]: each new row's normed KV latent and rotated RoPE key, to store and attend
  // to; q_latent [T, H, kv_lora_rank + qk_rope]: the queries with W_uk absorbed (absorb_latent_queries), whose dot
  // products with the rows are the model's logits (unscaled); kv_b the layer's [H * (qk_nope + v_head),
  // kv_lora_rank] expansion; out [T, H, v_head]: F32 on the CPU, the model's matmul dtype on CUDA (latent and
  // q_latent F32 on both). Called only when stores_latent().
  virtual void attend_latent(int /*layer*/, const LayerConfig& /*layer_config*/, const ForwardBatch& /*batch*/,
                             TensorView /*q_latent*/, TensorView /*latent*/, TensorView /*kv_b*/, TensorView /*out*/,
                             const AttentionParams& /*params*/) {
    SE_CHECK(false, "attend_latent: these hooks keep no latent store");
  }
  // Low-rank KV: when the hooks' owner keeps a KvStoreKind::kLowRankLatent store, the attention layer hands
  // over its queries and its normed input instead of k and v, and the owner projects the input to its latents,
  // stores them and attends to them.
  virtual bool stores_low_rank() const { return false; }
  // q [T, H, D]: the new rows' queries, normed and rotated; x [T, hidden]: the layer's normed input; out [T, H, D].
  // F32 on the CPU. Called only when stores_low_rank().
  virtual void attend_low_rank(int /*layer*/, const LayerConfig& /*layer_config*/, const ForwardBatch& /*batch*/,
                               TensorView /*q*/, TensorView /*x*/, TensorView /*out*/,
                               const AttentionParams& /*params*/) {
    SE_CHECK(false, "attend_low_rank: these hooks keep no low-rank store");
  }
  // experts [T, num_experts_per_tok] I32: the experts each row of `batch` is routed to in MoE layer `layer`, in
  // descending router probability, on the model's device.
  virtual void on_expert_choice(int /*layer*/, const ForwardBatch& /*batch*/, TensorView /*experts*/) {}
  // hidden [T, hidden_size]: the residual stream after the layer.
  virtual void on_layer_end(int /*layer*/, const ForwardBatch& /*batch*/, TensorView /*hidden*/) {}
};

}  // namespace se
