// Attention over low-rank KV latents on the CPU, fused: per (sequence, KV head) the keys its rows can see are
// rebuilt once from their latents (up_k, bias, per-head RMS norm, RoPE at the slot), every query of the head's group
// scores them, and the softmax-weighted value latents are summed per query and expanded once by up_v. Neither the
// keys nor the values of the cache exist outside the unit's scratch.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vector_math.h"
#include "backend/cpu/visible_keys.h"

namespace se::cpu {

namespace {

// Rebuilds KV head `head` (within its group) of the key whose latent is h_k, at `position`, into key [D].
void rebuild_key(const LatentKvView& lr, int32_t group, int32_t head, const float* h_k, int32_t position,
                 const RopeParams& rope, const float* inv_freq, float* key) {
  const int32_t d_head = lr.kv_head_dim, rank = lr.k_rank;
  const int64_t first_row = (int64_t{group} * lr.group_heads + head) * d_head;
  for (int32_t d = 0; d < d_head; ++d) key[d] = dot(lr.up_k + (first_row + d) * rank, h_k, rank);
  if (lr.k_bias != nullptr)
    for (int32_t d = 0; d < d_head; ++d) key[d] += lr.k_bias[first_row + d];
  if (lr.k_norm != nullptr) {
    const float inv_rms = 1.0f / std::sqrt(dot(key, key, d_head) / static_cast<float>(d_head) + lr.norm_eps);
    for (int32_t d = 0; d < d_head; ++d) key[d] = key[d] * inv_rms * lr.k_norm[d];
  }
  const int32_t half = rope.rotary_dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    // fp32 angle, as rope() computes it.
    const float angle = static_cast<float>(position) * inv_freq[i];
    const float c = std::cos(angle) * rope.attention_factor, s = std::sin(angle) * rope.attention_factor;
    const float a = key[i], b = key[i + half];
    key[i] = a * c - b * s;
    key[i + half] = b * c + a * s;
  }
}

struct Unit {
  int32_t slice = 0;
  int32_t kv_head = 0;
};

}  // namespace

void paged_low_rank_attention(TensorView out, TensorView q, const AttentionView& view, const RopeParams& rope,
                              const AttentionParams& params) {
  const LatentKvView& lr = view.latent;
  const int32_t d_head = lr.kv_head_dim, kv_heads = view.num_kv_heads * lr.group_heads;
  const auto heads = static_cast<int32_t>(q.shape[1]);
  const int32_t queries_per_kv = heads / kv_heads;
  std::vector<float> inv_freq(static_cast<size_t>(rope.rotary_dim / 2));
  rope_inv_freq(rope, inv_freq.data());
  std::vector<Unit> units;
  for (int32_t s = 0; s < view.num_seqs; ++s)
    if (view.q_indptr[s + 1] > view.q_indptr[s])
      for (int32_t h = 0; h < kv_heads; ++h) units.push_back({s, h});

#pragma omp parallel
  {
    std::vector<float> keys, logits, latent_sum;
#pragma omp for schedule(dynamic, 1)
    for (size_t u = 0; u < units.size(); ++u) {
      const int32_t group = units[u].kv_head / lr.group_heads, head = units[u].kv_head % lr.group_heads;
      const SeqKvView& sv = view.seqs[units[u].slice];
      const int32_t row_begin = view.q_indptr[units[u].slice];
      const int32_t n = view.q_indptr[units[u].slice + 1] - row_begin;
      const int32_t* pages = sv.page_ids + static_cast<int64_t>(group) * sv.stride;
      const auto row_of = [&](int32_t j) {
        return view.element<const float>(pages[j / view.page_size], 0, j % view.page_size);
      };
      // Every key some row of the unit sees: from the first row's window start to the stream's end.
      const VisibleRange all{visible_range(sv, group, n, 0, params.sliding_window).first, sv.num_tokens[group] - 1};
      const int32_t num_keys = std::max(0, all.last - all.first + 1);
      keys.resize(static_cast<size_t>(num_keys) * d_head);
      for (int32_t j = all.first; j <= all.last; ++j)
        rebuild_key(lr, group, head, row_of(j), j, rope, inv_freq.data(),
                    keys.data() + static_cast<int64_t>(j - all.first) * d_head);
      logits.resize(static_cast<size_t>(std::max(num_keys, 1)));
      latent_sum.resize(static_cast<size_t>(lr.v_rank));
      const int64_t out_first_row = (int64_t{group} * lr.group_heads + head) * d_head;
      for (int32_t r = 0; r < n; ++r) {
        const VisibleRange range = visible_range(sv, group, n, r, params.sliding_window);
        for (int32_t m = 0; m < queries_per_kv; ++m) {
          const int64_t offset =
              (int64_t{row_begin + r} * heads + int64_t{units[u].kv_head} * queries_per_kv + m) * d_head;
          float* o = out.ptr<float>() + offset;
          if (range.last < range.first) {
            std::fill_n(o, d_head, 0.0f);
            continue;
          }
          const int32_t count = range.last - range.first + 1;
          float* l = logits.data();
          for (int32_t i = 0; i < count; ++i) {
            float logit =
                dot(q.ptr<float>() + offset, keys.data() + int64_t{range.first - all.first + i} * d_head, d_head) *
                params.scale;
            if (params.logit_softcap > 0.0f) logit = params.logit_softcap * std::tanh(logit / params.logit_softcap);
            l[i] = logit;
          }
          const float inv_sum = 1.0f / exp_shifted_sum(l, count, *std::max_element(l, l + count));
          std::fill(latent_sum.begin(), latent_sum.end(), 0.0f);
          for (int32_t i = 0; i < count; ++i)
            axpy(l[i] * inv_sum, row_of(range.first + i) + lr.k_rank, latent_sum.data(), lr.v_rank);
          for (int32_t d = 0; d < d_head; ++d) {
            o[d] = dot(lr.up_v + (out_first_row + d) * lr.v_rank, latent_sum.data(), lr.v_rank);
            if (lr.v_bias != nullptr) o[d] += lr.v_bias[out_first_row + d];
          }
        }
      }
    }
  }
}

}  // namespace se::cpu
