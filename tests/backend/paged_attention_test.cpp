// The CPU paged attention against a float64 reference that applies the rules of attention_view.h directly:
// ragged batches mixing decode rows and prefill chunks (long enough to span several query tiles), KV heads of
// different lengths (as after eviction), pages scattered over the pool, sliding windows, soft-capping, and token
// or page selections. Outputs start poisoned, so a row the kernel skips shows up as NaN.
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

struct SeqSpec {
  int32_t num_rows;
  std::vector<int32_t> lengths;              // tokens per KV head (>= num_rows)
  std::vector<std::vector<int32_t>> selected;  // per KV head, ascending; empty = no selection for the sequence
};

struct CaseSpec {
  int32_t page_size, head_dim, num_heads, num_kv_heads;
  AttentionParams params;
  SelectionUnit unit;
  std::vector<SeqSpec> seqs;
};

// A paged pool with every stream's pages scattered at random, plus the view over it.
struct PagedBatch {
  std::vector<float> pool;
  std::vector<std::vector<int32_t>> page_ids, num_tokens, selected, num_selected;
  std::vector<SeqKvView> seqs;
  std::vector<int32_t> q_indptr{0};
  AttentionView view;
};

PagedBatch build(const CaseSpec& c, std::mt19937& rng) {
  PagedBatch b;
  int32_t num_pages = 0;
  for (const SeqSpec& s : c.seqs)
    for (int32_t len : s.lengths) num_pages += (len + c.page_size - 1) / c.page_size;
  std::vector<int32_t> free(static_cast<size_t>(num_pages));
  std::iota(free.begin(), free.end(), 0);
  std::shuffle(free.begin(), free.end(), rng);
  std::normal_distribution<float> normal;
  b.pool.resize(static_cast<size_t>(num_pages) * 2 * c.page_size * c.head_dim);
  for (float& x : b.pool) x = normal(rng);

  size_t next = 0;
  for (const SeqSpec& s : c.seqs) {
    int32_t stride = 0;
    for (int32_t len : s.lengths) stride = std::max(stride, (len + c.page_size - 1) / c.page_size);
    std::vector<int32_t>& pages = b.page_ids.emplace_back(static_cast<size_t>(stride) * c.num_kv_heads, -1);
    for (int32_t h = 0; h < c.num_kv_heads; ++h)
      for (int32_t p = 0; p < (s.lengths[h] + c.page_size - 1) / c.page_size; ++p)
        pages[static_cast<size_t>(h * stride + p)] = free[next++];
    b.num_tokens.push_back(s.lengths);
    int32_t sel_stride = 0;
    for (const auto& sel : s.selected) sel_stride = std::max(sel_stride, static_cast<int32_t>(sel.size()));
    std::vector<int32_t>& sel = b.selected.emplace_back(static_cast<size_t>(sel_stride) * c.num_kv_heads, 0);
    std::vector<int32_t>& count = b.num_selected.emplace_back(static_cast<size_t>(c.num_kv_heads), 0);
    for (size_t h = 0; h < s.selected.size(); ++h) {
      std::copy(s.selected[h].begin(), s.selected[h].end(), sel.begin() + static_cast<int64_t>(h) * sel_stride);
      count[h] = static_cast<int32_t>(s.selected[h].size());
    }
    b.q_indptr.push_back(b.q_indptr.back() + s.num_rows);
  }
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    SeqKvView v;
    v.page_ids = b.page_ids[i].data();
    v.stride = static_cast<int32_t>(b.page_ids[i].size()) / c.num_kv_heads;
    v.num_tokens = b.num_tokens[i].data();
    if (!c.seqs[i].selected.empty()) {
      v.selected = b.selected[i].data();
      v.selected_stride = static_cast<int32_t>(b.selected[i].size()) / c.num_kv_heads;
      v.num_selected = b.num_selected[i].data();
      b.view.has_selection = true;
    }
    b.seqs.push_back(v);
  }
  b.view.kv_base = b.pool.data();
  b.view.kv_dtype = DType::kF32;
  b.view.page_bytes = sizeof(float) * 2 * c.page_size * c.head_dim;
  b.view.page_size = c.page_size;
  b.view.head_dim = c.head_dim;
  b.view.num_kv_heads = c.num_kv_heads;
  b.view.num_seqs = static_cast<int32_t>(c.seqs.size());
  b.view.q_indptr = b.q_indptr.data();
  b.view.seqs = b.seqs.data();
  b.view.selection_unit = c.unit;
  return b;
}

std::vector<double> reference(const CaseSpec& c, const PagedBatch& b, const Tensor& q) {
  const int32_t group = c.num_heads / c.num_kv_heads;
  std::vector<double> out(static_cast<size_t>(q.numel()), 0.0);
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const SeqSpec& spec = c.seqs[s];
    for (int32_t r = 0; r < spec.num_rows; ++r)
      for (int32_t h = 0; h < c.num_heads; ++h) {
        const int32_t kvh = h / group;
        const int32_t last = spec.lengths[kvh] - spec.num_rows + r;
        const int32_t first = c.params.sliding_window > 0 ? std::max(0, last - c.params.sliding_window + 1) : 0;
        auto selected = [&](int32_t j) {
          if (spec.selected.empty()) return true;
          const int32_t unit = c.unit == SelectionUnit::kPage ? j / c.page_size : j;
          const auto& sel = spec.selected[kvh];
          return std::binary_search(sel.begin(), sel.end(), unit);
        };
        const float* qv = q.data<float>() + ((b.q_indptr[s] + r) * c.num_heads + h) * c.head_dim;
        std::vector<std::pair<int32_t, double>> logits;
        double max_logit = -std::numeric_limits<double>::infinity();
        for (int32_t j = first; j <= last; ++j) {
          if (!selected(j)) continue;
          const int32_t page = b.page_ids[s][static_cast<size_t>(kvh * b.seqs[s].stride + j / c.page_size)];
          const float* k = b.pool.data() + (static_cast<size_t>(page) * 2 * c.page_size + j % c.page_size) *
                                               static_cast<size_t>(c.head_dim);
          double logit = 0;
          for (int32_t d = 0; d < c.head_dim; ++d) logit += static_cast<double>(qv[d]) * k[d];
          logit *= c.params.scale;
          if (c.params.logit_softcap > 0) logit = c.params.logit_softcap * std::tanh(logit / c.params.logit_softcap);
          logits.emplace_back(j, logit);
          max_logit = std::max(max_logit, logit);
        }
        double denom = 0;
        for (const auto& [j, logit] : logits) denom += std::exp(logit - max_logit);
        double* o = out.data() + ((b.q_indptr[s] + r) * c.num_heads + h) * c.head_dim;
        for (const auto& [j, logit] : logits) {
          const int32_t page = b.page_ids[s][static_cast<size_t>(kvh * b.seqs[s].stride + j / c.page_size)];
          const float* v = b.pool.data() + (static_cast<size_t>(page) * 2 * c.page_size + c.page_size +
                                            j % c.page_size) * static_cast<size_t>(c.head_dim);
          const double w = std::exp(logit - max_logit) / denom;
          for (int32_t d = 0; d < c.head_dim; ++d) o[d] += w * v[d];
        }
      }
  }
  return out;
}

AttentionParams params(int32_t head_dim, int window = 0, float softcap = 0.0f) {
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  p.sliding_window = window;
  p.logit_softcap = softcap;
  return p;
}

// Ascending random subset of [0, n) with about `fraction` of the entries.
std::vector<int32_t> random_subset(int32_t n, double fraction, std::mt19937& rng) {
  std::bernoulli_distribution keep(fraction);
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i)
    if (keep(rng)) out.push_back(i);
  return out;
}

TEST(PagedAttentionCpuTest, MatchesFloat64ReferenceOnRaggedBatches) {
  std::mt19937 rng(7);
  std::vector<CaseSpec> cases;
  // Decode rows of three sequences, GQA group 3.
  cases.push_back({16, 64, 9, 3, params(64), SelectionUnit::kToken,
                   {{1, {37, 37, 37}, {}}, {1, {100, 100, 100}, {}}, {1, {5, 5, 5}, {}}}});
  // One prefill chunk over three query tiles against a cached prefix; one KV head, window and soft-cap.
  cases.push_back({16, 64, 4, 1, params(64, 20, 30.0f), SelectionUnit::kToken, {{70, {150}, {}}}});
  // A mixed step: a decode row, a fresh prompt, a chunk whose KV heads hold different lengths (evicted).
  cases.push_back({8, 32, 8, 2, params(32), SelectionUnit::kToken,
                   {{1, {64, 64}, {}}, {12, {12, 12}, {}}, {40, {90, 61}, {}}}});
  // Token selections (the new rows are always selected, as Selection::apply guarantees).
  {
    std::vector<int32_t> a = random_subset(199, 0.3, rng), b = random_subset(190, 0.5, rng);
    a.push_back(199);
    for (int32_t j = 190; j < 200; ++j) b.push_back(j);
    cases.push_back({16, 64, 6, 2, params(64), SelectionUnit::kToken, {{1, {200, 200}, {a, a}}, {10, {200, 200}, {b, a}}}});
  }
  // Page selections, one sequence with a window.
  {
    std::vector<int32_t> p0 = random_subset(12, 0.4, rng), p1 = random_subset(12, 0.6, rng);
    p0.push_back(12);
    p1.push_back(12);
    cases.push_back({16, 64, 4, 2, params(64, 50), SelectionUnit::kPage, {{9, {200, 200}, {p0, p1}}}});
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const CaseSpec& c = cases[i];
    PagedBatch batch = build(c, rng);
    const int32_t num_rows = batch.q_indptr.back();
    Tensor q = test::random_tensor({num_rows, c.num_heads, c.head_dim}, 100 + i);
    Tensor out = Tensor::empty(DType::kF32, {num_rows, c.num_heads, c.head_dim});
    std::fill_n(out.data<float>(), out.numel(), std::numeric_limits<float>::quiet_NaN());
    paged_attention(out.view(), q.view(), batch.view, c.params);
    const std::vector<double> ref = reference(c, batch, q);
    for (int64_t e = 0; e < out.numel(); ++e) ASSERT_FALSE(std::isnan(out.data<float>()[e])) << "case " << i;
    EXPECT_LT(test::relative_error(out.data<float>(), ref.data(), out.numel()), 2e-6) << "case " << i;
  }
}

}  // namespace
}  // namespace se
