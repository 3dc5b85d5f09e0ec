#include "model/layers/gated_mlp.h"

#include "model/layers/row_parallel.h"

namespace se {

namespace {

// act(gate) * up [t, intermediate], in the workspace's act buffer.
TensorView activated(const BlockInputs& in, TensorView x) {
  const TensorView gate_up = in.ws.gate_up(in.t);
  linear(gate_up, x, in.weights.gate_up.view());
  const TensorView act = in.ws.act(in.t);
  gated_activation(act, gate_up, in.config.activation);
  return act;
}

}  // namespace

void gated_mlp_add(const BlockInputs& in, TensorView h, TensorView x) {
  row_parallel_linear_add(in.comm, h, activated(in, x), in.weights.down.view());
}

void gated_mlp_out(const BlockInputs& in, TensorView out, TensorView x) {
  row_parallel_linear(in.comm, out, activated(in, x), in.weights.down.view());
}

}  // namespace se
