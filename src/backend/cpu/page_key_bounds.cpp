#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kivi_rows.h"
#include "backend/quant/fp8_kv.h"

namespace se::cpu {

void update_page_key_bounds(TensorView bounds, const AttentionView& view, int32_t /*max_new_tokens*/) {
  const int32_t head_dim = view.head_dim;
  // FP8 pages are bounded over their keys as attention decodes them (code x the KV head's scale).
  const bool fp8 = view.payload == KvPayload::kQuantized;
  std::vector<float> decoded(fp8 ? static_cast<size_t>(head_dim) : 0);
  for_each_page_with_new_tokens(view, [&](int32_t page, int32_t num_stored, int32_t kv_head) {
    float* lo = bounds.ptr<float>() + static_cast<int64_t>(page) * 2 * head_dim;
    float* hi = lo + head_dim;
    std::fill(lo, lo + head_dim, std::numeric_limits<float>::infinity());
    std::fill(hi, hi + head_dim, -std::numeric_limits<float>::infinity());
    for (int32_t t = 0; t < num_stored; ++t) {
      if (fp8)
        fp8_dequantize(view.element<const uint8_t>(page, 0, t), static_cast<size_t>(head_dim),
                       view.quantized.k_scales[kv_head], Fp8Format::kE4M3, decoded.data());
      const float* k = fp8 ? decoded.data() : view.element<float>(page, 0, t);
      for (int32_t d = 0; d < head_dim; ++d) {
        lo[d] = std::min(lo[d], k[d]);
        hi[d] = std::max(hi[d], k[d]);
      }
    }
  });
}

void update_key_group_bounds(TensorView bounds, const AttentionView& view, std::span<const int32_t> first_groups) {
  const QuantizedKvView& qv = view.quantized;
  const KiviPageLayout layout = kivi_page_layout(qv.group_size, qv.value_group_size, view.head_dim, qv.bits);
  for (int32_t s = 0; s < view.num_seqs; ++s)
    for (int32_t h = 0; h < view.num_kv_heads; ++h) {
      const KiviRows rows = KiviRows::of(view, layout, s, h);
      const int32_t num_groups = rows.num_quantized_keys / qv.group_size;
      for (int32_t g =
               first_groups[static_cast<size_t>(s) * static_cast<size_t>(view.num_kv_heads) + static_cast<size_t>(h)];
           g < num_groups; ++g) {
        float* lo = bounds.ptr<float>() + static_cast<int64_t>(rows.pages[g]) * 2 * view.head_dim;
        rows.key_group_bounds(g, lo, lo + view.head_dim);
      }
    }
}

namespace {

// The key bounds of each page of one stream (sequence `slice`, KV head `kv_head`), page p at lo(p) (min) and
// lo(p) + head_dim (max). Explicit and FP8 pages, and a KIVI stream's quantized groups, read the bounds tensor at
// the page's id; a KIVI page of window keys (full precision, the last group's tokens and those of up to R + a
// step's) is bounded here from its rows, which the store rewrites as the window fills.
class StreamBounds {
 public:
  StreamBounds(TensorView bounds, const AttentionView& view, int32_t slice, int32_t kv_head)
      : bounds_(bounds), view_(view) {
    const SeqKvView& sv = view.seqs[slice];
    pages_ = sv.page_ids + static_cast<int64_t>(kv_head) * sv.stride;
    num_tokens_ = sv.num_tokens[kv_head];
    if (!is_kivi_view(view)) return;
    const QuantizedKvView& qv = view.quantized;
    const KiviPageLayout layout = kivi_page_layout(qv.group_size, qv.value_group_size, view.head_dim, qv.bits);
    const KiviRows rows = KiviRows::of(view, layout, slice, kv_head);
    first_window_page_ = rows.num_quantized_keys / qv.group_size;
    const int32_t num_pages = (num_tokens_ + qv.group_size - 1) / qv.group_size;
    const int32_t head_dim = view.head_dim;
    window_.resize(static_cast<size_t>(std::max(0, num_pages - first_window_page_)) * 2 * head_dim);
    std::vector<float> local(static_cast<size_t>(head_dim));
    for (int32_t p = first_window_page_; p < num_pages; ++p) {
      float* lo = window_.data() + static_cast<int64_t>(p - first_window_page_) * 2 * head_dim;
      float* hi = lo + head_dim;
      std::fill(lo, lo + head_dim, std::numeric_limits<float>::infinity());
      std::fill(hi, hi + head_dim, -std::numeric_limits<float>::infinity());
      for (int32_t j = p * qv.group_size; j < std::min(num_tokens_, (p + 1) * qv.group_size); ++j) {
        const float* k = rows.key(j, local.data());
        for (int32_t d = 0; d < head_dim; ++d) {
          lo[d] = std::min(lo[d], k[d]);
          hi[d] = std::max(hi[d], k[d]);
        }
      }
    }
  }

  int32_t num_pages() const {
    const int32_t unit = selection_page_tokens(view_);
    return (num_tokens_ + unit - 1) / unit;
  }
  const float* lo(int32_t p) const {
    if (p >= first_window_page_)
      return window_.data() + static_cast<int64_t>(p - first_window_page_) * 2 * view_.head_dim;
    return bounds_.ptr<float>() + static_cast<int64_t>(pages_[p]) * 2 * view_.head_dim;
  }

 private:
  TensorView bounds_;
  const AttentionView& view_;
  const int32_t* pages_ = nullptr;
  int32_t num_tokens_ = 0;
  int32_t first_window_page_ = std::numeric_limits<int32_t>::max();  // KIVI: the first page of window keys
  std::vector<float> window_;  // KIVI: [pages from first_window_page_][2][head_dim]
};

}  // namespace

void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view, int32_t slice) {
  const int64_t num_heads = q.shape[0];
  const int64_t group = num_heads / view.num_kv_heads;
  const int32_t head_dim = view.head_dim;
  const int64_t max_pages = out.shape[1];
  for (int32_t kvh = 0; kvh < view.num_kv_heads; ++kvh) {
    const StreamBounds stream(bounds, view, slice, kvh);
    const int64_t num_pages = stream.num_pages();
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      const float* qv = q.ptr<float>() + h * head_dim;
      float* dst = out.ptr<float>() + h * max_pages;
      for (int64_t p = 0; p < max_pages; ++p) {
        if (p >= num_pages) {
          dst[p] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* lo = stream.lo(static_cast<int32_t>(p));
        const float* hi = lo + head_dim;
        float sum = 0.0f;
        for (int32_t d = 0; d < head_dim; ++d) sum += std::max(qv[d] * lo[d], qv[d] * hi[d]);
        dst[p] = sum;
      }
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
    const int32_t unit = selection_page_tokens(view);
    int32_t max_pages = 0;
    for (int32_t h = 0; h < view.num_kv_heads; ++h)
      max_pages = std::max(max_pages, (sv.num_tokens[h] + unit - 1) / unit);
    std::vector<float> head_scores(static_cast<size_t>(num_heads * max_pages));
    cpu::page_key_bound_scores(TensorView{head_scores.data(), DType::kF32, Shape{num_heads, max_pages}}, last_row,
                               bounds, view, s);
    int32_t* seq_lists = selected.ptr<int32_t>() + static_cast<int64_t>(s) * selected.shape[1] * selected.shape[2];
    int32_t* seq_counts = num_selected.ptr<int32_t>() + static_cast<int64_t>(s) * view.num_kv_heads;
    std::vector<float> group_scores;
    std::vector<int32_t> order;
    for (int32_t h = 0; h < view.num_kv_heads; ++h) {
      const int32_t num_pages = (sv.num_tokens[h] + unit - 1) / unit;
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
