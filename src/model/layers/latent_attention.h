// Multi-head latent attention (DeepSeek-V2's MLA) in its expanded form: q from the query projection (through the
// normed query latent when the model has one); the normed KV latent c_kv [kv_lora_rank] and a RoPE key shared by
// every head from kv_a; kv_b expands c_kv into each head's k_nope and v. RoPE turns only the rope parts, whose
// pairs the checkpoint interleaves: they are moved to the rotate-half layout rope() turns (the same pairs at the
// same frequencies, so q.k is unchanged). Each head then attends through the caller's hooks.attend like any
// multi-head attention: q and k [t, heads, head_dim] laid out [rope ; nope], v zero-padded from v_head_dim to
// head_dim (its padding only ever adds zeros to the output, which o_proj never reads). CPU reference path (fp32).
// Stateless; writes only the workspace.
#pragma once

#include "backend/ops.h"
#include "model/layers/block_inputs.h"

namespace se {

// h [t, hidden] += o_proj(attention(x)). x [t, hidden] is the normed input. Precondition: the model runs on the
// CPU.
void latent_attention_add(const BlockInputs& in, TensorView h, TensorView x);

}  // namespace se
