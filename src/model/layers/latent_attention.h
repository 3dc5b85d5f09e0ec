// Multi-head latent attention (DeepSeek-V2's MLA): q from the query projection (through the normed query latent
// when the model has one); the normed KV latent c_kv [kv_lora_rank] and a RoPE key shared by every head from kv_a;
// kv_b [heads * (qk_nope + v_head), kv_lora_rank] maps c_kv to each head's k_nope and v. RoPE turns only the rope
// parts, whose pairs the checkpoint interleaves: they are moved to the rotate-half layout rope() turns (the same
// pairs at the same frequencies, so q.k is unchanged; rope_latent_heads). Two forms, by what the hooks' owner stores:
//   latent (hooks.stores_latent()): the rows [c_kv ; k_rope] and the queries with W_uk absorbed
//     (absorb_latent_queries) go to hooks.attend_latent, which keeps one row per token for all heads and attends
//     with kv_b absorbed (paged_latent_attention);
//   expanded: kv_b expands every head, which attends through hooks.attend like any multi-head attention: q and k
//     [t, heads, head_dim] laid out [rope ; nope], v zero-padded from v_head_dim to head_dim (the padding only
//     adds zeros to the output, which o_proj never reads). The reference cache and the sparse methods take this.
// The latent form runs on the CPU (fp32) and on CUDA through the same ops; the expanded form on the CPU only.
// Stateless; writes only the workspace.
#pragma once

#include "backend/ops.h"
#include "model/layers/block_inputs.h"

namespace se {

// h [t, hidden] += o_proj(attention(x)). x [t, hidden] is the normed input. Precondition: the model runs on the
// CPU, or its hooks store the latent.
void latent_attention_add(const BlockInputs& in, TensorView h, TensorView x);

}  // namespace se
