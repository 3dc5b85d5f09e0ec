// Shape checks and device dispatch for backend/ops.h.
#include "backend/ops.h"

#include "backend/cpu/cpu_ops.h"
#include "base/check.h"

namespace se {

namespace {
void require_cpu_f32(const TensorView& t, const char* what) {
  SE_CHECK(t.device == Device::kCpu, "{}: only the CPU backend is built for this op", what);
  SE_CHECK(t.dtype == DType::kF32, "{}: expected f32, got {}", what, dtype_name(t.dtype));
}
int64_t last_dim(const TensorView& t) { return t.shape[t.shape.rank() - 1]; }
}  // namespace

void embedding(TensorView out, TensorView table, TensorView ids) {
  require_cpu_f32(out, "embedding.out");
  SE_CHECK(ids.dtype == DType::kI32 && table.shape.rank() == 2, "embedding: ids i32, table 2-d");
  SE_CHECK(out.numel() == ids.numel() * table.shape[1], "embedding: out {} for {} ids of dim {}",
           out.shape.to_string(), ids.numel(), table.shape[1]);
  cpu::embedding(out, table, ids);
}

void rms_norm(TensorView out, TensorView x, TensorView weight, float eps) {
  require_cpu_f32(out, "rms_norm.out");
  SE_CHECK(out.numel() == x.numel() && last_dim(x) == weight.numel(), "rms_norm: x {} weight {}",
           x.shape.to_string(), weight.shape.to_string());
  cpu::rms_norm(out, x, weight, eps);
}

void add_rms_norm(TensorView out, TensorView residual, TensorView x, TensorView weight, float eps) {
  require_cpu_f32(out, "add_rms_norm.out");
  SE_CHECK(out.numel() == x.numel() && residual.numel() == x.numel() && last_dim(x) == weight.numel(),
           "add_rms_norm: x {} residual {} weight {}", x.shape.to_string(), residual.shape.to_string(),
           weight.shape.to_string());
  cpu::add_rms_norm(out, residual, x, weight, eps);
}

void linear(TensorView out, TensorView x, TensorView w, const TensorView* bias) {
  require_cpu_f32(out, "linear.out");
  require_cpu_f32(w, "linear.w");
  SE_CHECK(w.shape.rank() == 2 && last_dim(x) == w.shape[1], "linear: x {} w {}", x.shape.to_string(),
           w.shape.to_string());
  SE_CHECK(out.numel() == x.numel() / w.shape[1] * w.shape[0], "linear: out {} for x {} w {}",
           out.shape.to_string(), x.shape.to_string(), w.shape.to_string());
  SE_CHECK(bias == nullptr || bias->numel() == w.shape[0], "linear: bias size");
  cpu::linear(out, x, w, bias);
}

void rope(TensorView x, TensorView positions, const RopeParams& params) {
  require_cpu_f32(x, "rope.x");
  SE_CHECK(x.shape.rank() == 3 && positions.numel() == x.shape[0], "rope: x {} positions {}",
           x.shape.to_string(), positions.numel());
  SE_CHECK(params.rotary_dim > 0 && params.rotary_dim % 2 == 0 && params.rotary_dim <= x.shape[2],
           "rope: rotary_dim {} head_dim {}", params.rotary_dim, x.shape[2]);
  cpu::rope(x, positions, params);
}

void gated_activation(TensorView out, TensorView gate_up, Activation act) {
  require_cpu_f32(out, "gated_activation.out");
  SE_CHECK(gate_up.numel() == 2 * out.numel(), "gated_activation: gate_up {} out {}",
           gate_up.shape.to_string(), out.shape.to_string());
  cpu::gated_activation(out, gate_up, act);
}

void add_inplace(TensorView x, TensorView y) {
  require_cpu_f32(x, "add_inplace.x");
  SE_CHECK(x.numel() == y.numel(), "add_inplace: {} vs {}", x.shape.to_string(), y.shape.to_string());
  cpu::add_inplace(x, y);
}

void scale_inplace(TensorView x, float s) {
  require_cpu_f32(x, "scale_inplace.x");
  cpu::scale_inplace(x, s);
}

void softcap_inplace(TensorView x, float cap) {
  require_cpu_f32(x, "softcap_inplace.x");
  SE_CHECK(cap > 0.0f, "softcap must be positive");
  cpu::softcap_inplace(x, cap);
}

void attention(TensorView out, TensorView q, TensorView k, TensorView v, TensorView q_positions,
               TensorView k_positions, const AttentionParams& params) {
  require_cpu_f32(out, "attention.out");
  SE_CHECK(q.shape.rank() == 3 && k.shape.rank() == 3 && v.shape == k.shape, "attention: q {} k {} v {}",
           q.shape.to_string(), k.shape.to_string(), v.shape.to_string());
  SE_CHECK(q.shape[2] == k.shape[2] && q.shape[1] % k.shape[1] == 0, "attention: heads q {} k {}",
           q.shape.to_string(), k.shape.to_string());
  SE_CHECK(q_positions.numel() == q.shape[0] && k_positions.numel() == k.shape[0],
           "attention: positions");
  cpu::attention(out, q, k, v, q_positions, k_positions, params);
}

void write_kv(const AttentionView& view, TensorView k, TensorView v) {
  require_cpu_f32(k, "write_kv.k");
  SE_CHECK(view.kv_dtype == DType::kF32, "write_kv: the CPU backend keeps f32 pages, got {}",
           dtype_name(view.kv_dtype));
  SE_CHECK(k.shape.rank() == 3 && k.shape[1] == view.num_kv_heads && k.shape[2] == view.head_dim &&
               v.shape == k.shape && k.shape[0] == view.q_indptr[view.num_seqs],
           "write_kv: k {} v {} for {} rows of {} KV heads x {}", k.shape.to_string(), v.shape.to_string(),
           view.q_indptr[view.num_seqs], view.num_kv_heads, view.head_dim);
  cpu::write_kv(view, k, v);
}

void paged_attention(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params) {
  require_cpu_f32(out, "paged_attention.out");
  SE_CHECK(view.kv_dtype == DType::kF32, "paged_attention: the CPU backend keeps f32 pages");
  SE_CHECK(q.shape.rank() == 3 && q.shape[2] == view.head_dim && q.shape[1] % view.num_kv_heads == 0 &&
               q.shape[0] == view.q_indptr[view.num_seqs] && out.numel() == q.numel(),
           "paged_attention: q {} for {} rows, {} KV heads x {}", q.shape.to_string(),
           view.q_indptr[view.num_seqs], view.num_kv_heads, view.head_dim);
  cpu::paged_attention(out, q, view, params);
}

}  // namespace se
