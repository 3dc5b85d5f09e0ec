// Self-attention with RoPE: one GEMM over the stacked q/k/v weight (plus its bias when the layer has one), q/k
// split off, per-head RMSNorm on q and k when the model has it, rotated in one pass, then the caller's
// hooks.attend (which owns the KV state) and o_proj. When the hooks keep a low-rank store, only q is projected,
// normed and rotated, and hooks.attend_low_rank takes it with the layer's input. Stateless; writes only the workspace.
#pragma once

#include "backend/ops.h"
#include "model/layers/block_inputs.h"

namespace se {

// h [t, hidden] += o_proj(attention(x)): the residual add fused into the o_proj GEMM. x [t, hidden] is the
// normed input.
void attention_add(const BlockInputs& in, TensorView h, TensorView x);

// out [t, hidden] = o_proj(attention(x)), for blocks that norm the output before adding it.
void attention_out(const BlockInputs& in, TensorView out, TensorView x);

}  // namespace se
