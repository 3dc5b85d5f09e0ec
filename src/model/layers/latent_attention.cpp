#include "model/layers/latent_attention.h"

#include <algorithm>
#include <cstring>

#include "backend/device_memory.h"
#include "base/check.h"
#include "model/layers/row_parallel.h"

namespace se {

namespace {

// The queries [t, heads, nope + rope] in ws.q_proj.
TensorView projected_queries(const BlockInputs& in) {
  const TensorView q_proj = in.ws.q_proj(in.t);
  return TensorView{q_proj.data, q_proj.dtype, {in.t, in.config.num_heads, in.config.head_dim}, q_proj.device};
}

// The projections both forms share, as rope_latent_heads leaves them: the queries [t, heads, nope + rope] in
// ws.q_proj (each head [q_nope ; q_rope], q_rope rotated) and the rows [c ; k_rope] [t, 1, rank + rope] in
// ws.latent_rows (c normed, k_rope rotated).
void project(const BlockInputs& in, TensorView x) {
  const ModelConfig& c = in.config;
  const LayerWeights& w = in.weights;
  const int64_t t = in.t, row_width = c.kv_lora_rank + c.qk_rope_head_dim;
  const TensorView q_proj = in.ws.q_proj(t);
  if (w.q_a.defined()) {
    const TensorView q_latent = in.ws.q_latent(t);
    linear(q_latent, x, w.q_a.view());
    rms_norm(q_latent, q_latent, w.q_a_norm.view(), c.rms_norm_eps);
    linear(q_proj, q_latent, w.q_proj.view());
  } else {
    linear(q_proj, x, w.q_proj.view());
  }
  const TensorView q = projected_queries(in);
  rope_latent_heads(q, q, in.ws.positions(t), in.layer_config.rope);
  // kv_a [t, rank + rope]: the latent, normed on its own, then the shared RoPE key.
  const TensorView kv_a = in.ws.kv_a(t);
  linear(kv_a, x, w.kv_a.view());
  const TensorView kv_a_norm = w.kv_a_norm.view();
  rope_latent_heads(in.ws.latent_rows(t), TensorView{kv_a.data, kv_a.dtype, {t, 1, row_width}, kv_a.device},
                    in.ws.positions(t), in.layer_config.rope, &kv_a_norm, c.rms_norm_eps);
}

// Every head's q, k and v expanded, attended through hooks.attend; the output [t, heads * v_head_dim] in the attn
// buffer. CPU only.
TensorView attend_expanded(const BlockInputs& in, const AttentionParams& params) {
  const ModelConfig& c = in.config;
  const int64_t t = in.t, heads = c.num_heads, head_dim = c.head_dim, rank = c.kv_lora_rank;
  const int64_t rope_dim = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, v_dim = c.v_head_dim;
  const float* rows = in.ws.latent_rows(t).ptr<float>();  // [t, rank + rope]
  const TensorView latent = in.ws.kv_latent(t);
  for (int64_t r = 0; r < t; ++r) std::copy_n(rows + r * (rank + rope_dim), rank, latent.ptr<float>() + r * rank);
  const TensorView kv_b = in.ws.kv_b(t);  // [t, heads, nope + v_dim]
  linear(kv_b, latent, in.weights.kv_b.view());
  const float* q_proj = in.ws.q_proj(t).ptr<float>();  // [t, heads, nope + rope]
  const TensorView q = in.ws.q(t);                     // [t, heads, head_dim]
  const TensorView k = in.ws.k(t);                     // [t, heads, head_dim]
  const TensorView v = in.ws.v(t);                     // [t, heads, head_dim]
  for (int64_t r = 0; r < t; ++r) {
    const float* k_rope = rows + r * (rank + rope_dim) + rank;
    for (int64_t head = 0; head < heads; ++head) {
      const int64_t row = r * heads + head;
      const float* q_src = q_proj + row * head_dim;
      float* q_dst = q.ptr<float>() + row * head_dim;
      std::copy_n(q_src + nope, rope_dim, q_dst);
      std::copy_n(q_src, nope, q_dst + rope_dim);
      const float* kv_src = kv_b.ptr<float>() + row * (nope + v_dim);
      float* k_dst = k.ptr<float>() + row * head_dim;
      std::copy_n(k_rope, rope_dim, k_dst);
      std::copy_n(kv_src, nope, k_dst + rope_dim);
      float* v_dst = v.ptr<float>() + row * head_dim;
      std::copy_n(kv_src + nope, v_dim, v_dst);
      std::fill(v_dst + v_dim, v_dst + head_dim, 0.0f);
    }
  }
  TensorView attn = in.ws.attn(t);
  in.hooks.attend(in.layer, in.layer_config, in.batch, q, k, v, attn, params);
  // Each head's first v_head_dim outputs, packed in place into the [t, heads * v_head_dim] rows o_proj reads: row i
  // moves down to i * v_dim from i * head_dim, never over a row still to move.
  float* out = attn.ptr<float>();
  for (int64_t row = 0; row < t * heads; ++row)
    std::memmove(out + row * v_dim, out + row * head_dim, static_cast<size_t>(v_dim) * sizeof(float));
  attn.shape = {t, heads * v_dim};
  return attn;
}

// The latent rows and the queries with W_uk absorbed handed to hooks.attend_latent, which stores the rows and
// attends to them; the output [t, heads * v_head_dim] in the attn buffer.
TensorView attend_latent(const BlockInputs& in, const AttentionParams& params) {
  const ModelConfig& c = in.config;
  const int64_t t = in.t, heads = c.num_heads;
  const TensorView q_latent = in.ws.q_absorbed(t);
  absorb_latent_queries(q_latent, projected_queries(in), in.weights.kv_b.view());
  const TensorView attn = in.ws.attn(t);
  TensorView out{attn.data, attn.dtype, {t, heads, c.v_head_dim}, attn.device};
  in.hooks.attend_latent(in.layer, in.layer_config, in.batch, q_latent, in.ws.latent_rows(t), in.weights.kv_b.view(),
                         out, params);
  out.shape = {t, heads * c.v_head_dim};
  return out;
}

}  // namespace

void latent_attention_add(const BlockInputs& in, TensorView h, TensorView x) {
  SE_CHECK(in.ws.device() == Device::kCpu || in.hooks.stores_latent(),
           "latent attention over expanded heads runs on the CPU only; on {} the cache keeps the shared latent",
           device_name(in.ws.device()));
  project(in, x);
  AttentionParams params;
  params.scale = in.config.attention_scale;
  const TensorView out = in.hooks.stores_latent() ? attend_latent(in, params) : attend_expanded(in, params);
  row_parallel_linear_add(in.comm, h, out, in.weights.o_proj.view());
}

}  // namespace se
