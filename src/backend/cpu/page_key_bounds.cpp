#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void update_page_key_bounds(TensorView bounds, const AttentionView& view, int32_t /*max_new_tokens*/) {
  const int32_t head_dim = view.head_dim;
  for_each_page_with_new_tokens(view, [&](int32_t page, int32_t num_stored) {
    float* lo = bounds.ptr<float>() + static_cast<int64_t>(page) * 2 * head_dim;
    float* hi = lo + head_dim;
    std::fill(lo, lo + head_dim, std::numeric_limits<float>::infinity());
    std::fill(hi, hi + head_dim, -std::numeric_limits<float>::infinity());
    for (int32_t t = 0; t < num_stored; ++t) {
      const float* k = view.element<float>(page, 0, t);
      for (int32_t d = 0; d < head_dim; ++d) {
        lo[d] = std::min(lo[d], k[d]);
        hi[d] = std::max(hi[d], k[d]);
      }
    }
  });
}

void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view, int32_t slice) {
  const SeqKvView& sv = view.seqs[slice];
  const int64_t num_heads = q.shape[0];
  const int64_t group = num_heads / view.num_kv_heads;
  const int32_t head_dim = view.head_dim;
  const int64_t max_pages = out.shape[1];
  for (int64_t h = 0; h < num_heads; ++h) {
    const int32_t kvh = static_cast<int32_t>(h / group);
    const int32_t* pages = sv.page_ids + static_cast<int64_t>(kvh) * sv.stride;
    const int64_t num_pages = (sv.num_tokens[kvh] + view.page_size - 1) / view.page_size;
    const float* qv = q.ptr<float>() + h * head_dim;
    float* dst = out.ptr<float>() + h * max_pages;
    for (int64_t p = 0; p < max_pages; ++p) {
      if (p >= num_pages) {
        dst[p] = -std::numeric_limits<float>::infinity();
        continue;
      }
      const float* lo = bounds.ptr<float>() + static_cast<int64_t>(pages[p]) * 2 * head_dim;
      const float* hi = lo + head_dim;
      float sum = 0.0f;
      for (int32_t d = 0; d < head_dim; ++d) sum += std::max(qv[d] * lo[d], qv[d] * hi[d]);
      dst[p] = sum;
    }
  }
}

void select_pages_by_key_bounds(TensorView selected, TensorView num_selected, TensorView q, TensorView bounds,
                                const AttentionView& view, int32_t page_budget, int32_t /*max_pages_per_stream*/,
                                GroupReduce reduce) {
  const int64_t num_heads = q.shape[1];
  const int64_t group = num_heads / view.num_kv_heads;
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const SeqKvView& sv = view.seqs[s];
    if (view.q_indptr[s + 1] == view.q_indptr[s]) {  // no query row: empty lists
      std::fill_n(num_selected.ptr<int32_t>() + static_cast<int64_t>(s) * view.num_kv_heads, view.num_kv_heads, 0);
      continue;
    }
    const TensorView last_row{q.ptr<float>() + static_cast<int64_t>(view.q_indptr[s + 1] - 1) * num_heads * view.head_dim,
                              DType::kF32, Shape{num_heads, view.head_dim}, Device::kCpu};
    int32_t max_pages = 0;
    for (int32_t h = 0; h < view.num_kv_heads; ++h)
      max_pages = std::max(max_pages, (sv.num_tokens[h] + view.page_size - 1) / view.page_size);
    std::vector<float> head_scores(static_cast<size_t>(num_heads * max_pages));
    cpu::page_key_bound_scores(TensorView{head_scores.data(), DType::kF32, Shape{num_heads, max_pages}}, last_row,
                               bounds, view, s);
    int32_t* seq_lists = selected.ptr<int32_t>() + static_cast<int64_t>(s) * selected.shape[1] * selected.shape[2];
    int32_t* seq_counts = num_selected.ptr<int32_t>() + static_cast<int64_t>(s) * view.num_kv_heads;
    std::vector<float> group_scores;
    std::vector<int32_t> order;
    for (int32_t h = 0; h < view.num_kv_heads; ++h) {
      const int32_t num_pages = (sv.num_tokens[h] + view.page_size - 1) / view.page_size;
      order.resize(static_cast<size_t>(num_pages));
      std::iota(order.begin(), order.end(), 0);
      if (num_pages > page_budget) {
        // Reduce the group's bounds of every page but the last, then keep the best (budget - 1) and the last.
        const int32_t num_candidates = num_pages - 1;
        group_scores.assign(static_cast<size_t>(num_candidates), 0.0f);
        for (int32_t p = 0; p < num_candidates; ++p) {
          float acc = head_scores[static_cast<size_t>(h * group * max_pages + p)];
          for (int64_t g = 1; g < group; ++g) {
            const float v = head_scores[static_cast<size_t>((h * group + g) * max_pages + p)];
            acc = reduce == GroupReduce::kMax ? std::max(acc, v) : acc + v;
          }
          group_scores[static_cast<size_t>(p)] = reduce == GroupReduce::kMean ? acc / static_cast<float>(group) : acc;
        }
        const auto better = [&](int32_t a, int32_t b) {
          const float sa = group_scores[static_cast<size_t>(a)], sb = group_scores[static_cast<size_t>(b)];
          return sa > sb || (sa == sb && a < b);
        };
        const auto keep_end = order.begin() + (page_budget - 1);
        std::nth_element(order.begin(), keep_end, order.begin() + num_candidates, better);
        *keep_end = num_pages - 1;
        order.resize(static_cast<size_t>(page_budget));
        std::sort(order.begin(), order.end());
      }
      std::copy(order.begin(), order.end(), seq_lists + static_cast<int64_t>(h) * selected.shape[2]);
      seq_counts[h] = static_cast<int32_t>(order.size());
    }
  }
}

}  // namespace se::cpu
