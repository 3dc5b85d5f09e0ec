#include <algorithm>
#include <limits>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void update_page_key_bounds(TensorView bounds, const AttentionView& view) {
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

void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view,
                           int32_t seq) {
  const SeqKvView& sv = view.seqs[seq];
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

}  // namespace se::cpu
