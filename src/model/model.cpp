#include "model/model.h"

#include <cstring>

#include "base/check.h"

namespace se {

namespace {
Tensor f32(Shape shape) { return Tensor::empty(DType::kF32, shape); }

TensorView i32_view(const std::vector<int32_t>& v) {
  return TensorView{const_cast<int32_t*>(v.data()), DType::kI32, {static_cast<int64_t>(v.size())}};
}

// Copies columns [col, col + width) of every row of `src` [rows, src_cols] into a new [rows, width] tensor.
Tensor take_columns(const Tensor& src, int64_t col, int64_t width) {
  const int64_t rows = src.dim(0);
  const int64_t src_cols = src.dim(1);
  Tensor out = f32({rows, width});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * width, src.data<float>() + r * src_cols + col,
                static_cast<size_t>(width) * sizeof(float));
  return out;
}
}  // namespace

Result<Model> Model::create(const nlohmann::json& hf_config, const std::map<std::string, Tensor>& tensors) {
  SE_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(hf_config));
  SE_ASSIGN_OR_RETURN(ModelWeights weights, ModelWeights::build(config, tensors));
  return Model(std::move(config), std::move(weights));
}

void Model::run_layer(int layer, const ForwardBatch& batch, Tensor& h, ForwardHooks& hooks) const {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const LayerConfig& lc = c.layers[static_cast<size_t>(layer)];
  const int64_t t = h.dim(0);
  const TensorView positions = i32_view(batch.positions);

  // Attention: norm -> fused qkv -> (q/k norm) -> RoPE -> hooks.attend -> o_proj.
  Tensor x = f32({t, c.hidden_size});
  rms_norm(x.view(), h.view(), w.input_norm.view(), c.rms_norm_eps);
  Tensor qkv = f32({t, c.q_size() + 2 * c.kv_size()});
  TensorView bias = w.qkv_bias.view();
  linear(qkv.view(), x.view(), w.qkv.view(), w.qkv_bias.defined() ? &bias : nullptr);
  Tensor q = take_columns(qkv, 0, c.q_size()).reshape({t, c.num_heads, c.head_dim});
  Tensor k = take_columns(qkv, c.q_size(), c.kv_size()).reshape({t, c.num_kv_heads, c.head_dim});
  Tensor v = take_columns(qkv, c.q_size() + c.kv_size(), c.kv_size()).reshape({t, c.num_kv_heads, c.head_dim});
  if (c.qk_norm) {
    rms_norm(q.view(), q.view(), w.q_norm.view(), c.rms_norm_eps);
    rms_norm(k.view(), k.view(), w.k_norm.view(), c.rms_norm_eps);
  }
  rope(q.view(), positions, lc.rope);
  rope(k.view(), positions, lc.rope);
  AttentionParams params;
  params.scale = c.attention_scale;
  params.logit_softcap = c.attn_logit_softcap;
  params.sliding_window = lc.sliding ? c.sliding_window : 0;
  Tensor attn = f32({t, c.num_heads, c.head_dim});
  hooks.attend(layer, lc, batch, q.view(), k.view(), v.view(), attn.view(), params);
  Tensor o = f32({t, c.hidden_size});
  linear(o.view(), attn.reshape({t, c.q_size()}).view(), w.o_proj.view());

  // MLP: (sandwich) norm -> fused gate/up -> gated activation -> down -> (sandwich) norm.
  if (c.sandwich_norm) {
    rms_norm(o.view(), o.view(), w.post_attention_norm.view(), c.rms_norm_eps);
    add_rms_norm(x.view(), h.view(), o.view(), w.pre_feedforward_norm.view(), c.rms_norm_eps);
  } else {
    add_rms_norm(x.view(), h.view(), o.view(), w.post_attention_norm.view(), c.rms_norm_eps);
  }
  Tensor gate_up = f32({t, 2 * c.intermediate_size});
  linear(gate_up.view(), x.view(), w.gate_up.view());
  Tensor act = f32({t, c.intermediate_size});
  gated_activation(act.view(), gate_up.view(), c.activation);
  Tensor mlp = f32({t, c.hidden_size});
  linear(mlp.view(), act.view(), w.down.view());
  if (c.sandwich_norm) rms_norm(mlp.view(), mlp.view(), w.post_feedforward_norm.view(), c.rms_norm_eps);
  add_inplace(h.view(), mlp.view());
  hooks.on_layer_end(layer, batch, h.view());
}

Tensor Model::forward(const ForwardBatch& batch, ForwardHooks& hooks) const {
  const ModelConfig& c = config_;
  const int64_t t = batch.num_tokens();
  SE_CHECK(t > 0 && static_cast<int64_t>(batch.positions.size()) == t, "forward: {} tokens, {} positions", t,
           batch.positions.size());
  Tensor h = f32({t, c.hidden_size});
  embedding(h.view(), weights_.embed_tokens.view(), i32_view(batch.token_ids));
  if (c.embedding_scale != 1.0f) scale_inplace(h.view(), c.embedding_scale);
  for (int layer = 0; layer < c.num_layers; ++layer) run_layer(layer, batch, h, hooks);

  const int64_t num_rows = static_cast<int64_t>(batch.logit_rows.size());
  if (num_rows == 0) return f32({0, c.vocab_size});
  Tensor last = f32({num_rows, c.hidden_size});
  for (int64_t i = 0; i < num_rows; ++i) {
    const int32_t row = batch.logit_rows[static_cast<size_t>(i)];
    SE_CHECK(row >= 0 && row < t, "logit row {} of {}", row, t);
    std::memcpy(last.data<float>() + i * c.hidden_size, h.data<float>() + row * c.hidden_size,
                static_cast<size_t>(c.hidden_size) * sizeof(float));
  }
  rms_norm(last.view(), last.view(), weights_.final_norm.view(), c.rms_norm_eps);
  Tensor logits = f32({num_rows, c.vocab_size});
  linear(logits.view(), last.view(), weights_.lm_head.view());
  if (c.final_logit_softcap > 0.0f) softcap_inplace(logits.view(), c.final_logit_softcap);
  return logits;
}

}  // namespace se
