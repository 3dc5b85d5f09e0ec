#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/visible_keys.h"

namespace se::cpu {

void write_kv(const AttentionView& view, TensorView k, TensorView v) {
  const int32_t head_dim = view.head_dim;
  const int32_t num_kv_heads = view.num_kv_heads;
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const SeqKvView& seq = view.seqs[s];
    const int32_t row_begin = view.q_indptr[s];
    const int32_t n = view.q_indptr[s + 1] - row_begin;
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      const int32_t* pages = seq.page_ids + static_cast<int64_t>(h) * seq.stride;
      const int32_t first = seq.num_tokens[h] - n;
      for (int32_t r = 0; r < n; ++r) {
        const int32_t slot = first + r;
        const int32_t page = pages[slot / view.page_size];
        const int32_t offset = slot % view.page_size;
        const int64_t src = (static_cast<int64_t>(row_begin + r) * num_kv_heads + h) * head_dim;
        std::memcpy(view.element<float>(page, 0, offset), k.ptr<float>() + src, sizeof(float) * head_dim);
        std::memcpy(view.element<float>(page, 1, offset), v.ptr<float>() + src, sizeof(float) * head_dim);
      }
    }
  }
}

void paged_attention(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params) {
  const int64_t num_heads = q.shape[1];
  const int32_t head_dim = view.head_dim;
  const int64_t group = num_heads / view.num_kv_heads;
  // One work item per (query row, head); rows are found from the sequence table.
  std::vector<int32_t> seq_of_row(static_cast<size_t>(q.shape[0]));
  for (int32_t s = 0; s < view.num_seqs; ++s)
    for (int32_t r = view.q_indptr[s]; r < view.q_indptr[s + 1]; ++r) seq_of_row[static_cast<size_t>(r)] = s;
  const int64_t num_items = q.shape[0] * num_heads;

#pragma omp parallel
  {
    std::vector<float> scores;
    std::vector<int32_t> keys;
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t row = item / num_heads;
      const int64_t h = item % num_heads;
      const int32_t s = seq_of_row[static_cast<size_t>(row)];
      const SeqKvView& seq = view.seqs[s];
      const int32_t kvh = static_cast<int32_t>(h / group);
      const int32_t* pages = seq.page_ids + static_cast<int64_t>(kvh) * seq.stride;
      const int32_t n = view.q_indptr[s + 1] - view.q_indptr[s];
      const VisibleRange range =
          visible_range(seq, kvh, n, static_cast<int32_t>(row - view.q_indptr[s]), params.sliding_window);
      const float* qv = q.ptr<float>() + (row * num_heads + h) * head_dim;
      float* o = out.ptr<float>() + (row * num_heads + h) * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      const float max_score = visible_logits(view, seq, kvh, range, qv, params, keys, scores);
      if (keys.empty()) continue;
      float denom = 0.0f;
      for (size_t i = 0; i < keys.size(); ++i) {
        const int32_t j = keys[i];
        const float p = std::exp(scores[i] - max_score);
        denom += p;
        const float* vv = view.element<float>(pages[j / view.page_size], 1, j % view.page_size);
        for (int32_t d = 0; d < head_dim; ++d) o[d] += p * vv[d];
      }
      const float inv = 1.0f / denom;
      for (int32_t d = 0; d < head_dim; ++d) o[d] *= inv;
    }
  }
}

}  // namespace se::cpu
