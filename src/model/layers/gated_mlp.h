// The dense gated MLP: one GEMM over the stacked gate/up weight, the model's gated activation (SwiGLU, GeGLU),
// then down. Stateless; writes only the workspace.
#pragma once

#include "backend/ops.h"
#include "model/layers/block_inputs.h"

namespace se {

// h [t, hidden] += down(act(gate(x)) * up(x)): the residual add fused into the down GEMM. x [t, hidden] is the
// normed input.
void gated_mlp_add(const BlockInputs& in, TensorView h, TensorView x);

// out [t, hidden] = down(act(gate(x)) * up(x)), for blocks that norm the output before adding it.
void gated_mlp_out(const BlockInputs& in, TensorView out, TensorView x);

}  // namespace se
