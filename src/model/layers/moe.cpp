#include "model/layers/moe.h"

#include "backend/moe_ops.h"
#include "model/layers/row_parallel.h"

namespace se {

namespace {
// The FP8 block scales of an expert matrix kept in FP8; an empty view for other weights.
TensorView optional_view(const Tensor& t) { return t.defined() ? t.view() : TensorView{}; }
}  // namespace

void moe_add(const BlockInputs& in, TensorView h, TensorView x) {
  const ModelConfig& c = in.config;
  const LayerWeights& w = in.weights;
  const int64_t t = in.t;

  const TensorView logits = in.ws.router_logits(t);
  linear(logits, x, w.router.view());
  const TensorView ids = in.ws.expert_ids(t);
  const TensorView gates = in.ws.expert_weights(t);
  route_experts(ids, gates, logits, c.norm_topk_prob);
  if (!c.norm_topk_prob && c.routed_scaling_factor != 1.0f) scale_inplace(gates, c.routed_scaling_factor);
  in.hooks.on_expert_choice(in.layer, in.batch, ids);

  // The t * k (token, expert) pairs grouped by expert: each projection is one grouped GEMM over every expert's
  // rows, and an expert no token chose is not read.
  const TensorView offsets = in.ws.expert_offsets(in.layer);
  const TensorView rows = in.ws.expert_rows(t);
  const TensorView slots = in.ws.expert_slots(t);
  group_by_expert(offsets, rows, slots, ids);
  const TensorView xe = in.ws.expert_in(t);
  embedding(xe, x, rows);  // each grouped row's token, gathered
  const TensorView gate_up = in.ws.expert_gate_up(t);
  grouped_linear(gate_up, xe, w.experts_gate_up.view(), offsets, t, optional_view(w.experts_gate_up_scale));
  const TensorView act = in.ws.expert_act(t);
  gated_activation(act, gate_up, c.activation);
  const TensorView out = in.ws.expert_out(t);
  grouped_linear(out, act, w.experts_down.view(), offsets, t, optional_view(w.experts_down_scale));
  // Split over tensor-parallel ranks, each expert's output here is this rank's part of its width.
  begin_row_parallel_sum(in.comm, h);
  moe_combine(h, out, gates, slots);
  if (c.shared_expert_intermediate_size > 0) {
    // The shared experts (one gated MLP as wide as all of them together) see every token, with weight 1.
    const TensorView shared_gate_up = in.ws.shared_expert_gate_up(t);
    linear(shared_gate_up, x, w.shared_gate_up.view());
    const TensorView shared_act = in.ws.shared_expert_act(t);
    gated_activation(shared_act, shared_gate_up, c.activation);
    linear_add(h, shared_act, w.shared_down.view());
  }
  end_row_parallel_sum(in.comm, h);
}

}  // namespace se
