// The mixture-of-experts MLP (Qwen3-MoE, DeepSeek-V2): a router GEMM, softmax over the experts, the top
// num_experts_per_tok of them per token (their probabilities renormalized to sum to 1 when the config asks, else
// multiplied by routed_scaling_factor), and the chosen experts' gated MLPs, weighted by those probabilities, added
// to the residual stream, plus the shared experts' MLP, which every token runs, when the model has one. Tokens are
// grouped by expert, so each expert with tokens runs one GEMM per projection and experts no token chose are not read.
// The CPU reference path (fp32); the routing and the gather/scatter run on the host. Stateless; writes only the
// workspace (and reports the routing to the hooks).
#pragma once

#include <cstdint>

#include "backend/ops.h"
#include "model/layers/block_inputs.h"

namespace se {

// h [t, hidden] += sum over the chosen experts e of p_e * down_e(act(gate_e(x)) * up_e(x)) (+ the shared experts'
// down_s(act(gate_s(x)) * up_s(x))). x [t, hidden] is the normed input. Precondition: the model runs on the CPU.
void moe_add(const BlockInputs& in, TensorView h, TensorView x);

// The routing of each row (host memory): `logits` [t, num_experts] F32 router logits in; out per row the top k
// experts (`experts` [t, k] I32, in descending probability, ties to the lower index) with their softmax
// probabilities (`weights` [t, k] F32), renormalized to sum to 1 when `normalize`.
void route_tokens(TensorView logits, bool normalize, TensorView experts, TensorView weights);

}  // namespace se
