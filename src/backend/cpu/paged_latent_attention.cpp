// Multi-head latent attention on the CPU, its two ops. absorb_latent_queries: one GEMM per head takes q_nope into
// latent space through W_uk[h], and q_rope is copied beside it. paged_latent_attention: the absorbed queries attend
// to the latent rows as multi-query attention whose keys and values are both the stored row [c ; k_rope] (the tile
// loop every paged attention shares), and the latent part of each head's output is expanded by its W_uv. The
// k_rope part of that output is computed and dropped: it keeps the row reads in place, one GEMM per tile.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/paged_attention_tiles.h"

namespace se::cpu {

namespace {

// The latent rows, in place: token j's row is both its key and its value.
struct LatentRows {
  static constexpr bool kInPlace = true;
  const AttentionView* view;
  const int32_t* pages;  // the sequence's page list
  const float* key(int32_t j, float* /*local*/) const {
    return view->element<float>(pages[j / view->page_size], 0, j % view->page_size);
  }
  const float* value(int32_t j, float* local) const { return key(j, local); }
};

}  // namespace

void absorb_latent_queries(TensorView q_latent, TensorView q_nope, TensorView q_rope, TensorView kv_b) {
  const int64_t rows = q_nope.shape[0], heads = q_nope.shape[1], nope = q_nope.shape[2], rope = q_rope.shape[2];
  const int64_t rank = kv_b.shape[1], width = q_latent.shape[2], per_head = kv_b.shape[0] / heads;
  const float* w = kv_b.ptr<float>();  // head h: rows [h * per_head, +nope) are W_uk
  for (int64_t h = 0; h < heads; ++h)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(rank),
                static_cast<int>(nope), 1.0f, q_nope.ptr<float>() + h * nope, static_cast<int>(heads * nope),
                w + h * per_head * rank, static_cast<int>(rank), 0.0f, q_latent.ptr<float>() + h * width,
                static_cast<int>(heads * width));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      std::copy_n(q_rope.ptr<float>() + (r * heads + h) * rope, rope,
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
