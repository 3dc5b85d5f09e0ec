// The mixture-of-experts MLP (Qwen3-MoE, DeepSeek-V2): a router GEMM, softmax over the experts, the top
// num_experts_per_tok of them per token (their probabilities renormalized to sum to 1 when the config asks, else
// multiplied by routed_scaling_factor), and the chosen experts' gated MLPs, weighted by those probabilities, added
// to the residual stream, plus the shared experts' MLP, which every token runs, when the model has one. Tokens
// are grouped by expert, so each projection is one grouped GEMM over every expert's rows and experts no token
// chose are not read (backend/moe_ops.h; the CPU reference in fp32, the CUDA twins without a host round trip).
// Stateless; writes only the workspace (and reports the routing to the hooks).
#pragma once

#include "backend/ops.h"
#include "model/layers/block_inputs.h"

namespace se {

// h [t, hidden] += sum over the chosen experts e of p_e * down_e(act(gate_e(x)) * up_e(x)) (+ the shared experts'
// down_s(act(gate_s(x)) * up_s(x))). x [t, hidden] is the normed input.
void moe_add(const BlockInputs& in, TensorView h, TensorView x);

}  // namespace se
