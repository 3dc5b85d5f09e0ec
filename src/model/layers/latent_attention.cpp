#include "model/layers/latent_attention.h"

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "model/layers/row_parallel.h"

namespace se {

namespace {

// dst [dim] = src's even elements, then its odd ones: a RoPE vector stored as interleaved pairs (x0, x1), (x2, x3)
// in the rotate-half layout, where pair i is (i, i + dim / 2).
void deinterleave(float* dst, const float* src, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    dst[i] = src[2 * i];
    dst[half + i] = src[2 * i + 1];
  }
}

// The projections both forms share: q [t, heads * head_dim] (each head [nope ; rope] as the checkpoint's rows
// are) into ws.q_proj, the normed latent [t, rank] into ws.kv_latent and the rotated shared RoPE key [t, 1, rope]
// into ws.k_rope.
void project(const BlockInputs& in, TensorView x) {
  const ModelConfig& c = in.config;
  const LayerWeights& w = in.weights;
  const int64_t t = in.t, rank = c.kv_lora_rank, rope_dim = c.qk_rope_head_dim;
  const TensorView q_proj = in.ws.q_proj(t);
  if (w.q_a.defined()) {
    const TensorView q_latent = in.ws.q_latent(t);
    linear(q_latent, x, w.q_a.view());
    rms_norm(q_latent, q_latent, w.q_a_norm.view(), c.rms_norm_eps);
    linear(q_proj, q_latent, w.q_proj.view());
  } else {
    linear(q_proj, x, w.q_proj.view());
  }
  // kv_a [t, rank + rope]: the latent, normed on its own, then the shared RoPE key.
  const TensorView kv_a = in.ws.kv_a(t);
  linear(kv_a, x, w.kv_a.view());
  const TensorView latent = in.ws.kv_latent(t);
  const TensorView k_rope = in.ws.k_rope(t);
  for (int64_t r = 0; r < t; ++r) {
    const float* row = kv_a.ptr<float>() + r * (rank + rope_dim);
    std::copy_n(row, rank, latent.ptr<float>() + r * rank);
    deinterleave(k_rope.ptr<float>() + r * rope_dim, row + rank, rope_dim);
  }
  rms_norm(latent, latent, w.kv_a_norm.view(), c.rms_norm_eps);
  rope(k_rope, in.ws.positions(t), in.layer_config.rope);
}

// Every head's q, k and v expanded, attended through hooks.attend; the output [t, heads * v_head_dim] in the attn
// buffer.
TensorView attend_expanded(const BlockInputs& in, const AttentionParams& params) {
  const ModelConfig& c = in.config;
  const int64_t t = in.t, heads = c.num_heads, head_dim = c.head_dim;
  const int64_t rope_dim = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, v_dim = c.v_head_dim;
  const TensorView kv_b = in.ws.kv_b(t);  // [t, heads, nope + v_dim]
  linear(kv_b, in.ws.kv_latent(t), in.weights.kv_b.view());
  const TensorView q_proj = in.ws.q_proj(t), k_rope = in.ws.k_rope(t);
  const TensorView q = in.ws.q(t);  // [t, heads, head_dim]
  const TensorView k = in.ws.k(t);  // [t, heads, head_dim]
  const TensorView v = in.ws.v(t);  // [t, heads, head_dim]
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t head = 0; head < heads; ++head) {
      const int64_t row = r * heads + head;
      const float* q_src = q_proj.ptr<float>() + row * head_dim;
      float* q_dst = q.ptr<float>() + row * head_dim;
      deinterleave(q_dst, q_src + nope, rope_dim);
      std::copy_n(q_src, nope, q_dst + rope_dim);
      const float* kv_src = kv_b.ptr<float>() + row * (nope + v_dim);
      float* k_dst = k.ptr<float>() + row * head_dim;
      std::copy_n(k_rope.ptr<float>() + r * rope_dim, rope_dim, k_dst);
      std::copy_n(kv_src, nope, k_dst + rope_dim);
      float* v_dst = v.ptr<float>() + row * head_dim;
      std::copy_n(kv_src + nope, v_dim, v_dst);
      std::fill(v_dst + v_dim, v_dst + head_dim, 0.0f);
    }
  }
  rope(q, in.ws.positions(t), in.layer_config.rope);
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

// The latent rows [c ; k_rope] and the queries with W_uk absorbed handed to hooks.attend_latent, which stores the
// rows and attends to them; the output [t, heads * v_head_dim] in the attn buffer.
TensorView attend_latent(const BlockInputs& in, const AttentionParams& params) {
  const ModelConfig& c = in.config;
  const int64_t t = in.t, heads = c.num_heads, head_dim = c.head_dim, rank = c.kv_lora_rank;
  const int64_t rope_dim = c.qk_rope_head_dim, nope = c.qk_nope_head_dim, v_dim = c.v_head_dim;
  const TensorView rows = in.ws.latent_rows(t);  // [t, 1, rank + rope]
  const float* latent = in.ws.kv_latent(t).ptr<float>();
  const float* k_rope = in.ws.k_rope(t).ptr<float>();
  for (int64_t r = 0; r < t; ++r) {
    std::copy_n(latent + r * rank, rank, rows.ptr<float>() + r * (rank + rope_dim));
    std::copy_n(k_rope + r * rope_dim, rope_dim, rows.ptr<float>() + r * (rank + rope_dim) + rank);
  }
  // q_nope [t, heads, nope] and q_rope [t, heads, rope] in the q and k buffers, which this form does not use.
  const Device device = in.ws.device();
  const TensorView q_nope{in.ws.q(t).data, DType::kF32, {t, heads, nope}, device};
  const TensorView q_rope{in.ws.k(t).data, DType::kF32, {t, heads, rope_dim}, device};
  const float* q_proj = in.ws.q_proj(t).ptr<float>();
  for (int64_t row = 0; row < t * heads; ++row) {
    std::copy_n(q_proj + row * head_dim, nope, q_nope.ptr<float>() + row * nope);
    deinterleave(q_rope.ptr<float>() + row * rope_dim, q_proj + row * head_dim + nope, rope_dim);
  }
  rope(q_rope, in.ws.positions(t), in.layer_config.rope);
  const TensorView q_latent = in.ws.q_absorbed(t);
  absorb_latent_queries(q_latent, q_nope, q_rope, in.weights.kv_b.view());
  TensorView out{in.ws.attn(t).data, DType::kF32, {t, heads, v_dim}, device};
  in.hooks.attend_latent(in.layer, in.layer_config, in.batch, q_latent, rows, in.weights.kv_b.view(), out, params);
  out.shape = {t, heads * v_dim};
  return out;
}

}  // namespace

void latent_attention_add(const BlockInputs& in, TensorView h, TensorView x) {
  SE_CHECK(in.ws.device() == Device::kCpu, "latent attention runs on the CPU only");
  project(in, x);
  AttentionParams params;
  params.scale = in.config.attention_scale;
  const TensorView out = in.hooks.stores_latent() ? attend_latent(in, params) : attend_expanded(in, params);
  row_parallel_linear_add(in.comm, h, out, in.weights.o_proj.view());
}

}  // namespace se
