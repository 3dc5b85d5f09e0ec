// absorb_latent_queries then paged_latent_attention (absorbed weights over a shared latent store) against a float64
// reference of the naive expanded form: every key k_j = [k_rope_j ; W_uk[h] c_j] and value v_j = W_uv[h] c_j
// materialized per head, then plain causal attention. Ragged batches mix decode rows with prefill chunks (longer
// than one query tile), over pages scattered in the pool; with and without a sliding window, and over a token
// selection (what a sparse method narrows the latent store to). Outputs start poisoned (NaN).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "op_test_util.h"

namespace se {
namespace {

constexpr int32_t kHeads = 4, kNope = 8, kRope = 6, kValue = 12, kRank = 16, kWidth = kRank + kRope;
constexpr int32_t kPageSize = 4;

struct Seq {
  int32_t rows;
  int32_t len;
};

// A token selection that drops every third token from the second on (token 0, which every row sees, stays).
bool in_selection(int32_t j) { return j % 3 != 1; }

void check(const std::vector<Seq>& seqs, const AttentionParams& params, uint64_t seed, bool select = false) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  int32_t num_pages = 0, total_rows = 0;
  for (const Seq& s : seqs) {
    num_pages += (s.len + kPageSize - 1) / kPageSize;
    total_rows += s.rows;
  }
  std::vector<int32_t> free(static_cast<size_t>(num_pages));
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), rng);
  const Tensor pool = test::random_tensor({num_pages, kPageSize, kWidth}, seed + 1);
  const Tensor kv_b = test::random_tensor({kHeads * (kNope + kValue), kRank}, seed + 2, 0.25f);
  const Tensor q_nope = test::random_tensor({total_rows, kHeads, kNope}, seed + 3);
  const Tensor q_rope = test::random_tensor({total_rows, kHeads, kRope}, seed + 4);

  std::vector<std::vector<int32_t>> page_ids;
  std::vector<int32_t> lengths, q_indptr{0};
  size_t next = 0;
  for (const Seq& s : seqs) {
    std::vector<int32_t>& pages = page_ids.emplace_back();
    for (int32_t p = 0; p < (s.len + kPageSize - 1) / kPageSize; ++p) pages.push_back(free[next++]);
    lengths.push_back(s.len);
    q_indptr.push_back(q_indptr.back() + s.rows);
  }
  std::vector<std::vector<int32_t>> selected(seqs.size());
  std::vector<int32_t> num_selected;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int32_t j = 0; j < seqs[i].len; ++j)
      if (in_selection(j)) selected[i].push_back(j);
    num_selected.push_back(static_cast<int32_t>(selected[i].size()));
  }
  std::vector<SeqKvView> views;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SeqKvView v;
    v.page_ids = page_ids[i].data();
    v.stride = static_cast<int32_t>(page_ids[i].size());
    v.num_tokens = &lengths[i];
    if (select) {
      v.selected = selected[i].data();
      v.selected_stride = num_selected[i];
      v.num_selected = &num_selected[i];
    }
    views.push_back(v);
  }
  AttentionView view;
  view.kv_base = pool.raw();
  view.page_bytes = sizeof(float) * kPageSize * kWidth;
  view.page_size = kPageSize;
  view.head_dim = kWidth;
  view.num_kv_heads = 1;
  view.num_seqs = static_cast<int32_t>(seqs.size());
  view.q_indptr = q_indptr.data();
  view.seqs = views.data();
  view.payload = KvPayload::kSharedLatent;
  view.has_selection = select;

  Tensor q_latent = Tensor::empty(DType::kF32, {total_rows, kHeads, kWidth});
  absorb_latent_queries(q_latent.view(), q_nope.view(), q_rope.view(), kv_b.view());
  Tensor out = Tensor::empty(DType::kF32, {total_rows, kHeads, kValue});
  std::fill_n(out.data<float>(), out.numel(), std::numeric_limits<float>::quiet_NaN());
  paged_latent_attention(out.view(), q_latent.view(), view, kv_b.view(), params);

  // The expanded form in float64.
  std::vector<double> ref(static_cast<size_t>(out.numel()));
  const float* w = kv_b.data<float>();
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int32_t len = seqs[s].len, n = seqs[s].rows;
    const auto latent = [&](int32_t j) {
      const int32_t page = page_ids[s][static_cast<size_t>(j / kPageSize)];
      return pool.data<float>() + (static_cast<int64_t>(page) * kPageSize + j % kPageSize) * kWidth;
    };
    for (int32_t h = 0; h < kHeads; ++h) {
      const float* w_uk = w + static_cast<int64_t>(h) * (kNope + kValue) * kRank;
      const float* w_uv = w_uk + static_cast<int64_t>(kNope) * kRank;
      std::vector<std::vector<double>> keys(static_cast<size_t>(len)), values(static_cast<size_t>(len));
      for (int32_t j = 0; j < len; ++j) {
        const float* c = latent(j);
        for (int32_t d = 0; d < kRope; ++d) keys[static_cast<size_t>(j)].push_back(c[kRank + d]);
        for (int32_t d = 0; d < kNope; ++d) {
          double k = 0;
          for (int32_t i = 0; i < kRank; ++i) k += double{w_uk[d * kRank + i]} * c[i];
          keys[static_cast<size_t>(j)].push_back(k);
        }
        for (int32_t d = 0; d < kValue; ++d) {
          double v = 0;
          for (int32_t i = 0; i < kRank; ++i) v += double{w_uv[d * kRank + i]} * c[i];
          values[static_cast<size_t>(j)].push_back(v);
        }
      }
      for (int32_t r = 0; r < n; ++r) {
        const int64_t row = q_indptr[s] + r;
        std::vector<double> q;
        q.reserve(kRope + kNope);
        for (int32_t d = 0; d < kRope; ++d) q.push_back(q_rope.data<float>()[(row * kHeads + h) * kRope + d]);
        for (int32_t d = 0; d < kNope; ++d) q.push_back(q_nope.data<float>()[(row * kHeads + h) * kNope + d]);
        const int32_t last = len - n + r;
        const int32_t first = params.sliding_window > 0 ? std::max(0, last - params.sliding_window + 1) : 0;
        std::vector<double> logits;
        logits.reserve(static_cast<size_t>(last) - static_cast<size_t>(first) + 1);
        for (int32_t j = first; j <= last; ++j) {
          double dot = 0;
          for (size_t d = 0; d < q.size(); ++d) dot += q[d] * keys[static_cast<size_t>(j)][d];
          logits.push_back(select && !in_selection(j) ? -std::numeric_limits<double>::infinity() : dot * params.scale);
        }
        const double max_logit = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (double& l : logits) sum += l = std::exp(l - max_logit);
        for (int32_t d = 0; d < kValue; ++d) {
          double acc = 0;
          for (int32_t j = first; j <= last; ++j)
            acc += logits[static_cast<size_t>(j - first)] * values[static_cast<size_t>(j)][static_cast<size_t>(d)];
          ref[static_cast<size_t>((row * kHeads + h) * kValue + d)] = acc / sum;
        }
      }
    }
  }
  EXPECT_LT(test::relative_error(out.data<float>(), ref.data(), out.numel()), 1e-5);
}

TEST(PagedLatentAttentionTest, AbsorbedEqualsExpandedOnRaggedBatches) {
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(kNope + kRope));
  // Decode rows of several lengths, a short chunk, and a prefill longer than one query tile (32 rows).
  check({{1, 1}, {1, 5}, {1, 17}, {4, 33}, {40, 40}}, params, 11);
  check({{3, 3}, {1, 64}, {9, 12}}, params, 12);
}

TEST(PagedLatentAttentionTest, TokenSelection) {
  AttentionParams params;
  params.scale = 0.3f;
  check({{1, 1}, {1, 17}, {4, 33}, {40, 40}}, params, 14, /*select=*/true);
}

TEST(PagedLatentAttentionTest, SlidingWindow) {
  AttentionParams params;
  params.scale = 0.3f;
  params.sliding_window = 7;
  check({{1, 20}, {5, 30}, {36, 36}}, params, 13);
}

TEST(PagedLatentAttentionTest, RefusesOtherPayloads) {
  AttentionView view;
  int32_t q_indptr[2] = {0, 0};
  view.q_indptr = q_indptr;
  view.num_kv_heads = 1;
  view.head_dim = kWidth;
  const Tensor q_latent = Tensor::empty(DType::kF32, {0, kHeads, kWidth});
  const Tensor kv_b = Tensor::empty(DType::kF32, {kHeads * (kNope + kValue), kRank});
  Tensor out = Tensor::empty(DType::kF32, {0, kHeads, kValue});
  EXPECT_DEATH(paged_latent_attention(out.view(), q_latent.view(), view, kv_b.view(), {}), "shared latent store");
}

}  // namespace
}  // namespace se
