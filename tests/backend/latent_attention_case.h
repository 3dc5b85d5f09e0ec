// A random shared-latent store (multi-head latent attention's kSharedLatent pages, attention_view.h), its queries
// [q_nope ; q_rope] and kv_b, and the float64 reference of the naive expanded form: every key k_j = [W_uk[h] c_j ;
// k_rope_j] and value v_j = W_uv[h] c_j materialized per head, then plain causal attention. Shared by the CPU op's
// test and the CUDA parity test. Ragged batches mix decode rows with prefill chunks over pages scattered in the
// pool; a selection keeps a subset of the tokens or of the pages (what a sparse method narrows the store to).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "op_test_util.h"

namespace se::test {

struct LatentShape {
  int32_t heads = 4, nope = 8, rope = 6, value = 12, rank = 16;
  int32_t page_size = 4;
  int32_t width() const { return rank + rope; }
  int32_t per_head() const { return nope + value; }
};

enum class LatentSelection { kNone, kTokens, kPages };

class LatentCase {
 public:
  // `round` maps every stored value and weight to what the device keeps (identity on the CPU).
  template <typename Round>
  LatentCase(const LatentShape& shape, const std::vector<PagedSeq>& seqs, uint64_t seed, LatentSelection selection,
             Round round)
      : shape_(shape), seqs_(seqs), selection_(selection) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const int32_t ps = shape.page_size;
    int32_t num_pages = 0;
    for (const PagedSeq& s : seqs) {
      num_pages += (s.len + ps - 1) / ps;
      total_rows_ += s.rows;
    }
    const std::vector<int32_t> free = shuffled_page_ids(num_pages, rng);
    const auto rounded = [&](Shape s, uint64_t seed_offset, float scale) {
      return rounded_random_tensor(s, seed + seed_offset, scale, round);
    };
    pool = rounded({num_pages, ps, shape.width()}, 1, 1.0f);
    kv_b = rounded({shape.heads * shape.per_head(), shape.rank}, 2, 1.0f / std::sqrt(float(shape.rank)));
    q = rounded({total_rows_, shape.heads, shape.nope + shape.rope}, 3, 0.5f);

    size_t next = 0;
    q_indptr.push_back(0);
    for (const PagedSeq& s : seqs) {
      std::vector<int32_t>& pages = page_ids.emplace_back();
      for (int32_t p = 0; p < (s.len + ps - 1) / ps; ++p) pages.push_back(free[next++]);
      lengths.push_back(s.len);
      q_indptr.push_back(q_indptr.back() + s.rows);
      std::vector<int32_t>& list = selected.emplace_back();
      if (selection == LatentSelection::kPages) {
        for (int32_t p = 0; p < static_cast<int32_t>(pages.size()); ++p)
          if (page_selected(p)) list.push_back(p);
      } else {
        for (int32_t j = 0; j < s.len; ++j)
          if (sees(j)) list.push_back(j);
      }
      num_selected.push_back(static_cast<int32_t>(list.size()));
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      SeqKvView v;
      v.page_ids = page_ids[i].data();
      v.stride = static_cast<int32_t>(page_ids[i].size());
      v.num_tokens = &lengths[i];
      if (selection != LatentSelection::kNone) {
        v.selected = selected[i].data();
        v.selected_stride = num_selected[i];
        v.num_selected = &num_selected[i];
      }
      seq_views.push_back(v);
    }
  }

  int64_t total_rows() const { return total_rows_; }

  // The host view over the f32 pool.
  AttentionView view() const {
    AttentionView v;
    v.kv_base = const_cast<void*>(pool.raw());
    v.page_bytes = sizeof(float) * shape_.page_size * shape_.width();
    v.page_size = shape_.page_size;
    v.head_dim = shape_.width();
    v.num_kv_heads = 1;
    v.num_seqs = static_cast<int32_t>(seqs_.size());
    v.q_indptr = q_indptr.data();
    v.seqs = seq_views.data();
    v.payload = KvPayload::kSharedLatent;
    v.has_selection = selection_ != LatentSelection::kNone;
    v.selection_unit = selection_ == LatentSelection::kPages ? SelectionUnit::kPage : SelectionUnit::kToken;
    return v;
  }

  // out [rows, heads, value] of the expanded form, in float64.
  std::vector<double> expanded_reference(const AttentionParams& params) const {
    const LatentShape& sh = shape_;
    std::vector<double> ref(static_cast<size_t>(total_rows_ * sh.heads * sh.value));
    const float* w = kv_b.data<float>();
    for (size_t s = 0; s < seqs_.size(); ++s) {
      const int32_t len = seqs_[s].len, n = seqs_[s].rows;
      const auto latent = [&](int32_t j) {
        const int32_t page = page_ids[s][static_cast<size_t>(j / sh.page_size)];
        return pool.data<float>() + (static_cast<int64_t>(page) * sh.page_size + j % sh.page_size) * sh.width();
      };
      for (int32_t h = 0; h < sh.heads; ++h) {
        const float* w_uk = w + static_cast<int64_t>(h) * sh.per_head() * sh.rank;
        const float* w_uv = w_uk + static_cast<int64_t>(sh.nope) * sh.rank;
        std::vector<std::vector<double>> keys(static_cast<size_t>(len)), values(static_cast<size_t>(len));
        for (int32_t j = 0; j < len; ++j) {
          const float* c = latent(j);
          for (int32_t d = 0; d < sh.nope; ++d) {
            double k = 0;
            for (int32_t i = 0; i < sh.rank; ++i) k += double{w_uk[d * sh.rank + i]} * c[i];
            keys[static_cast<size_t>(j)].push_back(k);
          }
          for (int32_t d = 0; d < sh.rope; ++d) keys[static_cast<size_t>(j)].push_back(c[sh.rank + d]);
          for (int32_t d = 0; d < sh.value; ++d) {
            double v = 0;
            for (int32_t i = 0; i < sh.rank; ++i) v += double{w_uv[d * sh.rank + i]} * c[i];
            values[static_cast<size_t>(j)].push_back(v);
          }
        }
        for (int32_t r = 0; r < n; ++r) {
          const int64_t row = q_indptr[s] + r;
          const float* q_row = q.data<float>() + (row * sh.heads + h) * (sh.nope + sh.rope);
          const int32_t last = len - n + r;
          const int32_t first = params.sliding_window > 0 ? std::max(0, last - params.sliding_window + 1) : 0;
          std::vector<double> logits;
          for (int32_t j = first; j <= last; ++j) {
            double dot = 0;
            for (int32_t d = 0; d < sh.nope + sh.rope; ++d) dot += double{q_row[d]} * keys[static_cast<size_t>(j)][d];
            logits.push_back(sees(j) ? dot * params.scale : -std::numeric_limits<double>::infinity());
          }
          const double max_logit = *std::max_element(logits.begin(), logits.end());
          double sum = 0;
          for (double& l : logits)
            sum += l = max_logit == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(l - max_logit);
          for (int32_t d = 0; d < sh.value; ++d) {
            double acc = 0;
            for (int32_t j = first; j <= last; ++j)
              acc += logits[static_cast<size_t>(j - first)] * values[static_cast<size_t>(j)][static_cast<size_t>(d)];
            ref[static_cast<size_t>((row * sh.heads + h) * sh.value + d)] = sum > 0 ? acc / sum : 0.0;
          }
        }
      }
    }
    return ref;
  }

  Tensor pool;  // [num_pages, page_size, rank + rope] f32
  Tensor kv_b;  // [heads * (nope + value), rank]
  Tensor q;     // [rows, heads, nope + rope]
  std::vector<std::vector<int32_t>> page_ids, selected;
  std::vector<int32_t> lengths, q_indptr, num_selected;
  std::vector<SeqKvView> seq_views;

 private:
  // Every third page from the second is dropped (page 0 stays); token selection drops every third token from the
  // second (token 0, which every row sees, stays).
  static bool page_selected(int32_t p) { return p % 3 != 1; }
  bool sees(int32_t j) const {
    switch (selection_) {
      case LatentSelection::kNone:
        return true;
      case LatentSelection::kTokens:
        return j % 3 != 1;
      case LatentSelection::kPages:
        return page_selected(j / shape_.page_size);
    }
    return true;
  }

  LatentShape shape_;
  std::vector<PagedSeq> seqs_;
  LatentSelection selection_;
  int64_t total_rows_ = 0;
};

}  // namespace se::test
