#include "model/layers/attention.h"

#include "base/check.h"
#include "model/layers/row_parallel.h"

namespace se {

namespace {

// Queries only, into ws.q [t, heads, head_dim]: the first q_size rows of the stacked weight (and bias), normed and
// rotated as split_qkv_rope would. What a low-rank store's layer computes itself; its hooks project the input to
// their own latents instead of k and v.
TensorView project_queries(const BlockInputs& in, TensorView x) {
  const ModelConfig& c = in.config;
  const LayerWeights& w = in.weights;
  const int64_t t = in.t, q_size = c.q_size();
  const TensorView q = in.ws.q(t);
  const TensorView q_rows{q.data, q.dtype, {t, q_size}, q.device};
  const TensorView bias = w.qkv_bias.defined() ? w.qkv_bias.slice_rows(0, q_size).view() : TensorView{};
  linear(q_rows, x, w.qkv.slice_rows(0, q_size).view(), w.qkv_bias.defined() ? &bias : nullptr);
  if (c.qk_norm) {
    const TensorView heads{q.data, q.dtype, {t * c.num_heads, c.head_dim}, q.device};
    rms_norm(heads, heads, w.q_norm.view(), c.rms_norm_eps);
  }
  rope(q, in.ws.positions(t), in.layer_config.rope);
  return q;
}

// The attention output before o_proj, [t, q_size] rows of the workspace's attn buffer.
TensorView attend_rows(const BlockInputs& in, TensorView x) {
  const ModelConfig& c = in.config;
  const LayerWeights& w = in.weights;
  const int64_t t = in.t;
  AttentionParams params;
  params.scale = c.attention_scale;
  params.logit_softcap = c.attn_logit_softcap;
  params.sliding_window = in.layer_config.sliding ? c.sliding_window : 0;
  TensorView attn = in.ws.attn(t);
  if (in.hooks.stores_low_rank()) {
    in.hooks.attend_low_rank(in.layer, in.layer_config, in.batch, project_queries(in, x), x, attn, params);
  } else {
    const TensorView q = in.ws.q(t);
    const TensorView k = in.ws.k(t);
    const TensorView v = in.ws.v(t);
    // One GEMM instead of three: the narrow k and v projections were small GEMMs far from the memory bandwidth the
    // wide one reaches.
    const TensorView qkv_bias = w.qkv_bias.defined() ? w.qkv_bias.view() : TensorView{};
    const TensorView qkv = in.ws.qkv(t);
    linear(qkv, x, w.qkv.view(), w.qkv_bias.defined() ? &qkv_bias : nullptr);
    const QkNorm qk_norm = c.qk_norm ? QkNorm{w.q_norm.view(), w.k_norm.view(), c.rms_norm_eps} : QkNorm{};
    split_qkv_rope(q, k, v, qkv, in.ws.positions(t), in.layer_config.rope, c.qk_norm ? &qk_norm : nullptr);
    in.hooks.attend(in.layer, in.layer_config, in.batch, q, k, v, attn, params);
  }
  // [t, heads, head_dim] -> [t, q_size]: same bytes, the shape the GEMM expects.
  SE_DCHECK(attn.numel() == t * c.q_size(), "attention rows {}", attn.shape.to_string());
  attn.shape = {t, c.q_size()};
  return attn;
}

}  // namespace

void attention_add(const BlockInputs& in, TensorView h, TensorView x) {
  row_parallel_linear_add(in.comm, h, attend_rows(in, x), in.weights.o_proj.view());
}

void attention_out(const BlockInputs& in, TensorView out, TensorView x) {
  row_parallel_linear(in.comm, out, attend_rows(in, x), in.weights.o_proj.view());
}

}  // namespace se
