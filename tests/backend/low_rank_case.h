// A random kLowRankLatent store (Palu's latents, attention_view.h) and its reference: the keys and values the
// latents stand for, rebuilt into explicit pages (up_k h_k + bias, per-head RMS norm, RoPE at the slot through the
// rope op; up_v h_v + bias) and attended by paged_attention. Shared by the CPU op's test and the CUDA parity test.
// Ragged batches mix prefill chunks with decode rows over pages scattered in the pool.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "op_test_util.h"

namespace se::test {

struct LowRankShape {
  int32_t groups = 2, group_heads = 2, head_dim = 16, k_rank = 5, v_rank = 7, queries_per_kv = 2;
  int32_t page_size = 4;
  bool bias = true, k_norm = true;
  int32_t kv_heads() const { return groups * group_heads; }
  int32_t heads() const { return kv_heads() * queries_per_kv; }
  int32_t width() const { return k_rank + v_rank; }
};

class LowRankCase {
 public:
  // `round` maps every stored or factor value to what the device keeps (identity on the CPU).
  template <typename Round>
  LowRankCase(const LowRankShape& shape, const std::vector<PagedSeq>& seqs, uint64_t seed, Round round)
      : shape_(shape), seqs_(seqs) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const int32_t ps = shape.page_size, d = shape.head_dim;
    int32_t pages_per_group = 0;
    for (const PagedSeq& s : seqs) {
      pages_per_group += (s.len + ps - 1) / ps;
      total_rows_ += s.rows;
    }
    num_pages_ = pages_per_group * shape.groups;
    const std::vector<int32_t> free = shuffled_page_ids(num_pages_, rng);
    const auto rounded = [&](Shape s, uint64_t seed_offset, float scale) {
      return rounded_random_tensor(s, seed + seed_offset, scale, round);
    };
    pool = rounded({num_pages_, ps, shape.width()}, 1, 1.0f);
    up_k = rounded({shape.groups, shape.group_heads * d, shape.k_rank}, 2, 0.6f);
    up_v = rounded({shape.groups, shape.group_heads * d, shape.v_rank}, 3, 0.5f);
    k_bias = rounded({shape.kv_heads() * d}, 4, 0.3f);
    v_bias = rounded({shape.kv_heads() * d}, 5, 0.3f);
    k_norm = rounded({d}, 6, 0.2f);
    for (int64_t i = 0; i < k_norm.numel(); ++i) k_norm.data<float>()[i] = round(1.0f + k_norm.data<float>()[i]);
    q = rounded({total_rows_, shape.heads(), d}, 7, 1.0f);
    size_t next = 0;
    q_indptr = {0};
    for (const PagedSeq& s : seqs) {
      std::vector<int32_t>& ids = page_ids.emplace_back();
      const int32_t n = (s.len + ps - 1) / ps;
      for (int32_t g = 0; g < shape.groups; ++g)
        for (int32_t p = 0; p < n; ++p) ids.push_back(free[next++]);
      lengths.emplace_back(static_cast<size_t>(shape.groups), s.len);
      q_indptr.push_back(q_indptr.back() + s.rows);
    }
    for (size_t i = 0; i < seqs.size(); ++i)
      seq_views.push_back(SeqKvView{page_ids[i].data(), (seqs[i].len + ps - 1) / ps, lengths[i].data()});
  }

  // The latent store's view (host tables, the pool and factors in host memory).
  AttentionView view() const {
    AttentionView v;
    v.kv_base = pool.data<float>();
    v.kv_dtype = DType::kF32;
    v.page_size = shape_.page_size;
    v.head_dim = shape_.width();
    v.page_bytes = static_cast<size_t>(shape_.page_size) * shape_.width() * sizeof(float);
    v.num_kv_heads = shape_.groups;
    v.num_seqs = static_cast<int32_t>(seqs_.size());
    v.q_indptr = q_indptr.data();
    v.seqs = seq_views.data();
    v.payload = KvPayload::kLowRankLatent;
    v.latent.up_k = up_k.data<float>();
    v.latent.up_v = up_v.data<float>();
    v.latent.k_bias = shape_.bias ? k_bias.data<float>() : nullptr;
    v.latent.v_bias = shape_.bias ? v_bias.data<float>() : nullptr;
    v.latent.k_norm = shape_.k_norm ? k_norm.data<float>() : nullptr;
    v.latent.norm_eps = 1e-6f;
    v.latent.k_rank = shape_.k_rank;
    v.latent.v_rank = shape_.v_rank;
    v.latent.group_heads = shape_.group_heads;
    v.latent.kv_head_dim = shape_.head_dim;
    return v;
  }

  // What attention over the keys and values the latents stand for gives: out [rows, heads, head_dim].
  Tensor reference(const RopeParams& rope, const AttentionParams& params) const {
    const int32_t d = shape_.head_dim, kv_heads = shape_.kv_heads(), ps = shape_.page_size;
    const AttentionView latent = view();
    std::vector<float> explicit_pages;
    std::vector<std::vector<int32_t>> explicit_ids(seqs_.size());
    int32_t num_pages = 0;
    for (size_t s = 0; s < seqs_.size(); ++s) {
      const int32_t len = seqs_[s].len, n = (len + ps - 1) / ps;
      // Every KV head's keys at once, [len, kv_heads, d], rotated by the rope op at positions 0..len-1.
      Tensor keys = Tensor::zeros(DType::kF32, {len, kv_heads, d});
      Tensor values = Tensor::zeros(DType::kF32, {len, kv_heads, d});
      for (int32_t h = 0; h < kv_heads; ++h) {
        const int32_t g = h / shape_.group_heads;
        const int32_t* pages = seq_views[s].page_ids + g * seq_views[s].stride;
        for (int32_t j = 0; j < len; ++j) {
          const float* row = latent.element<const float>(pages[j / ps], 0, j % ps);
          float* k = keys.data<float>() + (int64_t{j} * kv_heads + h) * d;
          float* v = values.data<float>() + (int64_t{j} * kv_heads + h) * d;
          for (int32_t e = 0; e < d; ++e) {
            const int64_t factor_row = int64_t{h} * d + e;  // == (g * group_heads + h % group_heads) * d + e
            double sk = shape_.bias ? k_bias.data<float>()[factor_row] : 0.0;
            double sv = shape_.bias ? v_bias.data<float>()[factor_row] : 0.0;
            for (int32_t r = 0; r < shape_.k_rank; ++r)
              sk += double{up_k.data<float>()[factor_row * shape_.k_rank + r]} * row[r];
            for (int32_t r = 0; r < shape_.v_rank; ++r)
              sv += double{up_v.data<float>()[factor_row * shape_.v_rank + r]} * row[shape_.k_rank + r];
            k[e] = static_cast<float>(sk);
            v[e] = static_cast<float>(sv);
          }
          if (shape_.k_norm) {
            double sq = 0;
            for (int32_t e = 0; e < d; ++e) sq += double{k[e]} * k[e];
            const double inv = 1.0 / std::sqrt(sq / d + 1e-6);
            for (int32_t e = 0; e < d; ++e) k[e] = static_cast<float>(k[e] * inv * k_norm.data<float>()[e]);
          }
        }
      }
      Tensor positions = Tensor::empty(DType::kI32, {len});
      std::iota(positions.data<int32_t>(), positions.data<int32_t>() + len, 0);
      se::rope(keys.view(), positions.view(), rope);
      for (int32_t h = 0; h < kv_heads; ++h)
        for (int32_t p = 0; p < n; ++p) {
          explicit_ids[s].push_back(num_pages++);
          explicit_pages.resize(static_cast<size_t>(num_pages) * 2 * ps * d, 0.0f);
          float* page = explicit_pages.data() + static_cast<size_t>(num_pages - 1) * 2 * ps * d;
          for (int32_t o = 0; o < ps && p * ps + o < len; ++o) {
            std::copy_n(keys.data<float>() + (int64_t{p * ps + o} * kv_heads + h) * d, d, page + o * d);
            std::copy_n(values.data<float>() + (int64_t{p * ps + o} * kv_heads + h) * d, d, page + (ps + o) * d);
          }
        }
    }
    std::vector<std::vector<int32_t>> explicit_lengths;
    std::vector<SeqKvView> explicit_seqs;
    for (size_t s = 0; s < seqs_.size(); ++s) {
      explicit_lengths.emplace_back(static_cast<size_t>(kv_heads), seqs_[s].len);
      explicit_seqs.push_back(
          SeqKvView{explicit_ids[s].data(), (seqs_[s].len + ps - 1) / ps, explicit_lengths.back().data()});
    }
    AttentionView v;
    v.kv_base = explicit_pages.data();
    v.kv_dtype = DType::kF32;
    v.page_size = ps;
    v.head_dim = d;
    v.page_bytes = static_cast<size_t>(2) * ps * d * sizeof(float);
    v.num_kv_heads = kv_heads;
    v.num_seqs = static_cast<int32_t>(seqs_.size());
    v.q_indptr = q_indptr.data();
    v.seqs = explicit_seqs.data();
    Tensor out = Tensor::empty(DType::kF32, {total_rows_, shape_.heads(), d});
    paged_attention(out.view(), q.view(), v, params);
    return out;
  }

  int32_t total_rows() const { return total_rows_; }
  int32_t num_pages() const { return num_pages_; }

  Tensor pool, up_k, up_v, k_bias, v_bias, k_norm, q;
  std::vector<std::vector<int32_t>> page_ids, lengths;
  std::vector<int32_t> q_indptr;
  std::vector<SeqKvView> seq_views;

 private:
  LowRankShape shape_;
  std::vector<PagedSeq> seqs_;
  int32_t total_rows_ = 0;
  int32_t num_pages_ = 0;
};

}  // namespace se::test
