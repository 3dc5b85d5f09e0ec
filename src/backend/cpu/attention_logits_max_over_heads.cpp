#include <algorithm>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vector_math.h"

namespace se::cpu {

void attention_logits_max_over_heads(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                     float scale) {
  const SeqKvView& sv = view.seqs[slice];
  const int64_t num_heads = q.shape[0];
  const int64_t group = num_heads / view.num_kv_heads;
  const int32_t head_dim = view.head_dim;
  const int64_t num_keys = out.shape[0];
  float* dst = out.ptr<float>();
  std::fill(dst, dst + num_keys, -std::numeric_limits<float>::infinity());
  for (int32_t kvh = 0; kvh < view.num_kv_heads; ++kvh) {
    const int32_t* pages = sv.page_ids + static_cast<int64_t>(kvh) * sv.stride;
    const float* q_group = q.ptr<float>() + kvh * group * head_dim;  // the group's query heads, [group, D]
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < num_keys; ++j) {
      const float* k =
          view.element<float>(pages[j / view.page_size], 0, static_cast<int32_t>(j % view.page_size));
      float best = dst[j];
      for (int64_t g = 0; g < group; ++g) {
        best = std::max(best, dot(q_group + g * head_dim, k, head_dim) * scale);
      }
      dst[j] = best;
    }
  }
}

void token_lists_with_tail(TensorView lists, TensorView counts, TensorView tokens, const AttentionView& view,
                           int32_t slice, int32_t tail_begin) {
  const int64_t k = tokens.numel();
  for (int32_t h = 0; h < view.num_kv_heads; ++h) {
    int32_t* list = lists.ptr<int32_t>() + h * lists.shape[1];
    std::copy_n(tokens.ptr<int32_t>(), k, list);
    const int32_t len = view.seqs[slice].num_tokens[h];
    for (int32_t j = tail_begin; j < len; ++j) list[k + (j - tail_begin)] = j;
    counts.ptr<int32_t>()[h] = static_cast<int32_t>(k + (len - tail_begin));
  }
}

}  // namespace se::cpu
