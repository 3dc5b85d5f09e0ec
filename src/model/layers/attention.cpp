#include "model/layers/attention.h"

#include "base/check.h"
#include "model/layers/row_parallel.h"

namespace se {

namespace {

// The attention output before o_proj, [t, q_size] rows of the workspace's attn buffer.
TensorView attend_rows(const BlockInputs& in, TensorView x) {
  const ModelConfig& c = in.config;
  const LayerWeights& w = in.weights;
  const int64_t t = in.t;
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
  AttentionParams params;
  params.scale = c.attention_scale;
  params.logit_softcap = c.attn_logit_softcap;
  params.sliding_window = in.layer_config.sliding ? c.sliding_window : 0;
  TensorView attn = in.ws.attn(t);
  in.hooks.attend(in.layer, in.layer_config, in.batch, q, k, v, attn, params);
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
