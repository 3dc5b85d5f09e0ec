// CPU reference of subset_attention_max_scores (ops.h). Per KV head, the key subset [sinks; range; new tokens]
// is gathered once into a contiguous [m_all, D] block; each (query head, block of rows) then takes its logits
// with one GEMM, the row softmax over the causally visible part of the subset, and a running max of the range's
// probabilities. The max is order-free, so the result does not depend on the thread schedule.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

namespace {

constexpr int64_t kRowBlock = 64;  // query rows per GEMM

// Copies keys [first, first + count) of one stream (page list `pages`) to dst [count, D].
void gather_keys(const AttentionView& view, const int32_t* pages, int32_t first, int32_t count, float* dst) {
  const size_t row_bytes = static_cast<size_t>(view.head_dim) * sizeof(float);
  for (int32_t i = 0; i < count; ++i) {
    const int32_t j = first + i;
    std::memcpy(dst + static_cast<int64_t>(i) * view.head_dim,
                view.element<float>(pages[j / view.page_size], 0, j % view.page_size), row_bytes);
  }
}

}  // namespace

void subset_attention_max_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                 int32_t num_sink, int32_t begin, const AttentionParams& params) {
  const SeqKvView& sv = view.seqs[slice];
  const int64_t num_rows = q.shape[0];
  const int64_t num_heads = q.shape[1];
  const int64_t group = num_heads / view.num_kv_heads;
  const int32_t head_dim = view.head_dim;
  const auto num_range = static_cast<int32_t>(out.shape[1]);
  const int64_t num_keys = num_sink + num_range + num_rows;  // the subset seen by the last row
  const int64_t num_blocks = (num_rows + kRowBlock - 1) / kRowBlock;
  const float softcap = params.logit_softcap;
  std::fill(out.ptr<float>(), out.ptr<float>() + out.numel(), 0.0f);
  std::vector<float> keys(static_cast<size_t>(num_keys * head_dim));  // [num_keys, D]

  for (int32_t kvh = 0; kvh < view.num_kv_heads; ++kvh) {
    const int32_t* pages = sv.page_ids + static_cast<int64_t>(kvh) * sv.stride;
    const int32_t first_new = sv.num_tokens[kvh] - static_cast<int32_t>(num_rows);
    gather_keys(view, pages, 0, num_sink, keys.data());
    gather_keys(view, pages, begin, num_range, keys.data() + int64_t{num_sink} * head_dim);
    gather_keys(view, pages, first_new, static_cast<int32_t>(num_rows),
                keys.data() + (int64_t{num_sink} + num_range) * head_dim);
    float* dst = out.ptr<float>() + int64_t{kvh} * num_range;

#pragma omp parallel
    {
      std::vector<float> logits(static_cast<size_t>(kRowBlock * num_keys));  // [rows of a block, num_keys]
      std::vector<float> best(static_cast<size_t>(num_range), 0.0f);
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t blk = 0; blk < num_blocks; ++blk) {
          const int64_t h = int64_t{kvh} * group + g;
          const int64_t r0 = blk * kRowBlock;
          const int64_t rows = std::min(kRowBlock, num_rows - r0);
          const float* q_rows = q.ptr<float>() + (r0 * num_heads + h) * head_dim;  // row stride H * D
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(num_keys),
                      head_dim, params.scale, q_rows, static_cast<int>(num_heads * head_dim), keys.data(), head_dim,
                      0.0f, logits.data(), static_cast<int>(num_keys));
          for (int64_t i = 0; i < rows; ++i) {
            float* row = logits.data() + i * num_keys;
            const int64_t num_visible = num_sink + num_range + r0 + i + 1;  // causal over the new tokens
            float max_logit = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < num_visible; ++j) {
              if (softcap > 0.0f) row[j] = softcap * std::tanh(row[j] / softcap);
              max_logit = std::max(max_logit, row[j]);
            }
            float denom = 0.0f;
            for (int64_t j = 0; j < num_visible; ++j) denom += (row[j] = std::exp(row[j] - max_logit));
            const float inv = 1.0f / denom;
            const float* range = row + num_sink;
            for (int32_t j = 0; j < num_range; ++j) {
              float& b = best[static_cast<size_t>(j)];
              b = std::max(b, range[j] * inv);
            }
          }
        }
      }
#pragma omp critical
      for (int32_t j = 0; j < num_range; ++j) dst[j] = std::max(dst[j], best[static_cast<size_t>(j)]);
    }
  }
}

}  // namespace se::cpu
