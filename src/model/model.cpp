#include "model/model.h"

#include "backend/device_memory.h"
#include "base/check.h"

namespace se {

namespace {
// [t, a, b] view of a [t, a * b] buffer (or the reverse): same bytes, the shape an op expects.
TensorView reshaped(TensorView v, Shape shape) {
  SE_DCHECK(shape.numel() == v.numel(), "reshape {} -> {}", v.shape.to_string(), shape.to_string());
  v.shape = shape;
  return v;
}
}  // namespace

Result<Model> Model::create(const nlohmann::json& hf_config, const std::map<std::string, Tensor>& tensors,
                            Device device) {
  SE_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(hf_config));
  SE_ASSIGN_OR_RETURN(ModelWeights weights, ModelWeights::build(config, tensors));
  return Model(std::move(config), weights.on_device(device), device);
}

Model::Model(ModelConfig config, ModelWeights weights, Device device)
    : config_(std::move(config)), weights_(std::move(weights)), device_(device) {}

void Model::run_layer(int layer, const ForwardBatch& batch, int64_t t, ForwardHooks& hooks,
                      const ForwardWorkspace& ws) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const LayerConfig& lc = c.layers[static_cast<size_t>(layer)];
  const TensorView h = ws.hidden(t);
  const TensorView x = ws.normed(t);
  const TensorView positions = ws.positions(t);

  // Attention: norm -> one GEMM over the stacked q, k, v weight -> q, k, v split off, (q/k norm,) rotated in one
  // pass -> hooks.attend -> o_proj. One GEMM instead of three: the narrow k and v projections were small GEMMs far
  // from the memory bandwidth the wide one reaches.
  rms_norm(x, h, w.input_norm.view(), c.rms_norm_eps);
  const TensorView q = ws.q(t);
  const TensorView k = ws.k(t);
  const TensorView v = ws.v(t);
  const TensorView qkv_bias = w.qkv_bias.defined() ? w.qkv_bias.view() : TensorView{};
  const TensorView qkv = ws.qkv(t);
  linear(qkv, x, w.qkv.view(), w.qkv_bias.defined() ? &qkv_bias : nullptr);
  const QkNorm qk_norm = c.qk_norm ? QkNorm{w.q_norm.view(), w.k_norm.view(), c.rms_norm_eps} : QkNorm{};
  split_qkv_rope(q, k, v, qkv, positions, lc.rope, c.qk_norm ? &qk_norm : nullptr);
  AttentionParams params;
  params.scale = c.attention_scale;
  params.logit_softcap = c.attn_logit_softcap;
  params.sliding_window = lc.sliding ? c.sliding_window : 0;
  const TensorView attn = ws.attn(t);
  hooks.attend(layer, lc, batch, q, k, v, attn, params);
  const TensorView attn_rows = reshaped(attn, {t, c.q_size()});

  // o_proj, then the MLP: (sandwich) norm -> fused gate/up -> gated activation -> down -> (sandwich) norm. Without
  // sandwich norms, o_proj and down add straight into the residual stream h (in the GEMM, not a pass of their own).
  if (c.sandwich_norm) {
    const TensorView o = ws.proj(t);
    linear(o, attn_rows, w.o_proj.view());
    rms_norm(o, o, w.post_attention_norm.view(), c.rms_norm_eps);
    add_rms_norm(x, h, o, w.pre_feedforward_norm.view(), c.rms_norm_eps);
  } else {
    linear_add(h, attn_rows, w.o_proj.view());
    rms_norm(x, h, w.post_attention_norm.view(), c.rms_norm_eps);
  }
  const TensorView gate_up = ws.gate_up(t);
  linear(gate_up, x, w.gate_up.view());
  const TensorView act = ws.act(t);
  gated_activation(act, gate_up, c.activation);
  if (c.sandwich_norm) {
    const TensorView mlp = ws.proj(t);
    linear(mlp, act, w.down.view());
    rms_norm(mlp, mlp, w.post_feedforward_norm.view(), c.rms_norm_eps);
    add_inplace(h, mlp);
  } else {
    linear_add(h, act, w.down.view());
  }
  hooks.on_layer_end(layer, batch, h);
}

Tensor Model::forward(const ForwardBatch& batch, ForwardHooks& hooks, ForwardWorkspace& ws) const {
  prepare_forward(batch, hooks, ws);
  return launch_forward(batch, hooks, ws);
}

void Model::prepare_forward(const ForwardBatch& batch, ForwardHooks& hooks, ForwardWorkspace& ws) const {
  const int64_t t = batch.num_tokens();
  SE_CHECK(t > 0 && static_cast<int64_t>(batch.positions.size()) == t, "forward: {} tokens, {} positions", t,
           batch.positions.size());
  for (int32_t row : batch.logit_rows) SE_CHECK(row >= 0 && row < t, "logit row {} of {}", row, t);
  SE_CHECK(ws.device() == device_, "forward: a {} workspace for a {} model", device_name(ws.device()),
           device_name(device_));
  ws.upload_inputs(batch);
  hooks.begin_forward(batch);
}

Tensor Model::launch_forward(const ForwardBatch& batch, ForwardHooks& hooks, const ForwardWorkspace& ws) const {
  const ModelConfig& c = config_;
  const int64_t t = batch.num_tokens();
  const auto num_rows = static_cast<int64_t>(batch.logit_rows.size());
  const TensorView h = ws.hidden(t);
  embedding(h, weights_.embed_tokens.view(), ws.token_ids(t));
  if (c.embedding_scale != 1.0f) scale_inplace(h, c.embedding_scale);
  for (int layer = 0; layer < c.num_layers; ++layer) run_layer(layer, batch, t, hooks, ws);

  Tensor logits = ws.logits(num_rows);
  if (num_rows == 0) return logits;
  // The sampled rows of the residual stream, gathered as an embedding lookup into h.
  const TensorView last = ws.last(num_rows);
  embedding(last, h, ws.logit_rows(num_rows));
  const TensorView last_normed = ws.last_normed(num_rows);
  rms_norm(last_normed, last, weights_.final_norm.view(), c.rms_norm_eps);
  linear(logits.view(), last_normed, weights_.lm_head.view());
  if (c.final_logit_softcap > 0.0f) softcap_inplace(logits.view(), c.final_logit_softcap);
  return logits;
}

}  // namespace se
