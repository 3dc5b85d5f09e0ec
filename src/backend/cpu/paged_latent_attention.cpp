// Multi-head latent attention on the CPU, its three ops. rope_latent_heads: each head's first part normed (when
// asked) and its interleaved RoPE part moved to the rotate-half layout and turned, as rms_norm and rope compute them.
// absorb_latent_queries: one GEMM per head takes q_nope into latent space through W_uk[h], and q_rope is copied
// beside it. paged_latent_attention: the absorbed queries attend
// to the latent rows as multi-query attention whose keys and values are both the stored row [c ; k_rope] (the tile
// loop every paged attention shares), and the latent part of each head's output is expanded by its W_uv. The
// k_rope part of that output is computed and dropped: the rows are read whole, as the tile loop reads any store's.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/paged_attention_tiles.h"

namespace se::cpu {

namespace {

// The latent rows, in place: token j's row is both its key and its value.
struct LatentRows {
  const AttentionView* view;
  const int32_t* pages;  // the sequence's page list
  const float* key(int32_t j, float* /*local*/) const {
    return view->element<float>(pages[j / view->page_size], 0, j % view->page_size);
  }
  const float* value(int32_t j, float* local) const { return key(j, local); }
};

}  // namespace

void rope_latent_heads(TensorView out, TensorView x, TensorView positions, const RopeParams& rope,
                       const TensorView* norm_weight, float eps) {
  const int64_t tokens = x.shape[0], heads = x.shape[1], width = x.shape[2];
  const int64_t half = rope.rotary_dim / 2, first = width - rope.rotary_dim;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  rope_inv_freq(rope, inv_freq.data());
  std::vector<float> head(static_cast<size_t>(width));
  for (int64_t t = 0; t < tokens; ++t) {
    const auto position = static_cast<float>(positions.ptr<int32_t>()[t]);
    for (int64_t h = 0; h < heads; ++h) {
      const float* src = x.ptr<float>() + (t * heads + h) * width;
      float* dst = out.ptr<float>() + (t * heads + h) * width;
      std::copy_n(src, width, head.data());  // out may alias x
      if (norm_weight != nullptr) {
        double square_sum = 0.0;
        for (int64_t i = 0; i < first; ++i) square_sum += static_cast<double>(head[i]) * head[i];
        const float inv = 1.0f / std::sqrt(static_cast<float>(square_sum / static_cast<double>(first)) + eps);
        for (int64_t i = 0; i < first; ++i) dst[i] = head[i] * inv * norm_weight->ptr<float>()[i];
      } else {
        std::copy_n(head.data(), first, dst);
      }
      // The checkpoint's pair (2i, 2i + 1) turns as the rotate-half pair (i, i + half) at frequency i.
      for (int64_t i = 0; i < half; ++i) {
        const float angle = position * inv_freq[static_cast<size_t>(i)];
        const float cos_v = std::cos(angle) * rope.attention_factor, sin_v = std::sin(angle) * rope.attention_factor;
        const float a = head[first + 2 * i], b = head[first + 2 * i + 1];
        dst[first + i] = a * cos_v - b * sin_v;
        dst[first + half + i] = b * cos_v + a * sin_v;
      }
    }
  }
}

void absorb_latent_queries(TensorView q_latent, TensorView q, TensorView kv_b) {
  const int64_t rows = q.shape[0], heads = q.shape[1], rank = kv_b.shape[1], width = q_latent.shape[2];
  const int64_t rope = width - rank, q_width = q.shape[2], nope = q_width - rope, per_head = kv_b.shape[0] / heads;
  const float* w = kv_b.ptr<float>();  // head h: rows [h * per_head, +nope) are W_uk
  for (int64_t h = 0; h < heads; ++h)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(rank),
                static_cast<int>(nope), 1.0f, q.ptr<float>() + h * q_width, static_cast<int>(heads * q_width),
                w + h * per_head * rank, static_cast<int>(rank), 0.0f, q_latent.ptr<float>() + h * width,
                static_cast<int>(heads * width));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      std::copy_n(q.ptr<float>() + (r * heads + h) * q_width + nope, rope,
                  q_latent.ptr<float>() + (r * heads + h) * width + rank);
}

void paged_latent_attention(TensorView out, TensorView q_latent, const AttentionView& view, TensorView kv_b,
                            const AttentionParams& params) {
  const int64_t rows = q_latent.shape[0], heads = q_latent.shape[1], width = view.head_dim;
  const int64_t v_dim = out.shape[2], rank = kv_b.shape[1], per_head = kv_b.shape[0] / heads;
  std::vector<float> o_lat(static_cast<size_t>(rows * heads * width));
  const TensorView o_view{o_lat.data(), DType::kF32, {rows, heads, width}, Device::kCpu};
  paged_attention_tiles(o_view, q_latent, view, params,
                        [&](int32_t s, int32_t /*kv_head*/) { return LatentRows{&view, view.seqs[s].page_ids}; });

  // out[r, h] = W_uv[h] o_lat[r, h, :rank]; W_uv[h] is the last v_dim rows of head h's block of kv_b.
  const float* w = kv_b.ptr<float>();
  for (int64_t h = 0; h < heads; ++h) {
    const float* w_uv = w + ((h + 1) * per_head - v_dim) * rank;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(v_dim),
                static_cast<int>(rank), 1.0f, o_lat.data() + h * width, static_cast<int>(heads * width), w_uv,
                static_cast<int>(rank), 0.0f, out.ptr<float>() + h * v_dim, static_cast<int>(heads * v_dim));
  }
}

}  // namespace se::cpu
