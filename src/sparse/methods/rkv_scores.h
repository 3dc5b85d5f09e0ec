// R-KV scoring and selection (METHODS-2.md §3, from the reference code Zefan-Cai/R-KV rkv/compression/r1_kv.py and
// rkv/utils.py): attention importance from the newest w queries, minus key-similarity redundancy, ranked per
// (layer, KV head). Plain functions (rkv_score where its tensors live, the rest on host buffers); no state,
// thread-compatible.
//
// For one layer with T cached tokens, w = window, G = num_heads / num_kv_heads, per KV head:
//   1. logits[r, j] = max over the G query heads of q_r . k_j / sqrt(d) (GQA pooling "max", before the softmax);
//   2. importance[j] = mean over the w rows of softmax over j < T - w (the window's keys are left out of the
//      normalization); then max-pooled along j (kernel, stride 1, -inf padding);
//   3. redundancy: S = cosine similarities of all T keys (k / (|k| + 1e-8)), diagonal 0; in each row i the largest
//      j with S[i, j] > threshold (0 when there is none: the reference then clears column 0) is set to 0, so each
//      token's newest near-duplicate goes unpenalized; redundancy[j] = softmax over j of the column mean of S;
//   4. score[j] = lambda * importance[j] - (1 - lambda) * redundancy[j], j < T - w (at lambda 1 the redundancy is
//      not computed: the pooled importance alone, SnapKV's score);
//   5. keep the budget - w best of them (ties: the lower index) plus the w newest tokens.
// Steps 1-2 are the backend op group_max_attention_importance, step 3 key_redundancy and the pooling and mix of
// step 4 redundancy_aware_scores (ops.h): rkv_score runs them where its tensors live (the method on a GPU), the
// host-buffer functions below on their CPU twins.
// NOTE: the reference casts the importance to the model dtype; this stays in fp32 and accumulates dot products in
// double, so fp32 inputs rank as the reference does up to rounding-level near-ties.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace se {

struct RkvParams {
  int32_t budget = 1024;   // tokens kept per (layer, KV head) after a compression, the window included
  int32_t buffer = 128;    // decoded tokens between compressions (the reference's divide_length)
  int32_t window = 8;      // newest queries that score; the newest tokens, always kept
  int32_t kernel = 7;      // max-pool kernel (odd)
  // mix_lambda: the reference code's default (R1KV.__init__); its README and paper say 0.1.
  float mix_lambda = 0.07f;
  float similarity_threshold = 0.5f;  // fixed in the reference's cal_similarity
};

// Scores of the T - w older tokens of one layer, per KV head.
struct RkvScores {
  int32_t num_kv_heads = 0;
  int32_t num_prefix = 0;     // T - w
  std::vector<float> values;  // [num_kv_heads, num_prefix]
};

// rkv_score's intermediate scores where they are computed, grown as needed and kept across calls.
struct RkvScratch {
  Tensor importance;  // [num_kv_heads, T - w]
  Tensor redundancy;  // [num_kv_heads, T]
};

// Steps 1-4 as backend ops on `out`'s device (only enqueued on a GPU): out [num_kv_heads, T - w]; queries
// [w, num_heads, head_dim] and keys [T, num_kv_heads, head_dim] F32 on the same device, as below.
void rkv_score(TensorView out, TensorView queries, TensorView keys, const RkvParams& params, RkvScratch& scratch);

// Step 5 for one KV head's scores [T - w] of its T tokens: the stream positions it keeps, ascending (every
// position when T <= budget).
std::vector<int32_t> rkv_keep(const float* scores, int32_t num_tokens, const RkvParams& params);

// queries [w, num_heads, head_dim]: the newest w post-RoPE queries, oldest first; keys [T, num_kv_heads,
// head_dim]: the cached post-RoPE keys in stream order. Requires T > w and num_heads % num_kv_heads == 0.
RkvScores rkv_scores(const float* queries, const float* keys, int32_t num_tokens, int32_t num_heads,
                     int32_t num_kv_heads, int32_t head_dim, const RkvParams& params);

// The stream positions each KV head keeps ([num_kv_heads] lists, ascending, budget entries each); every position
// when T <= budget (the reference compresses only a longer cache).
std::vector<std::vector<int32_t>> rkv_select(const float* queries, const float* keys, int32_t num_tokens,
                                             int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                                             const RkvParams& params);

// The reference's decode trigger (R1KV.should_compact): the step that brings the decoded-token count across a
// multiple of `buffer` compresses, once the cache holds at least budget + buffer tokens.
bool rkv_should_compress(int64_t resident_tokens, int64_t num_decoded_tokens, int64_t num_new_tokens,
                         const RkvParams& params);

}  // namespace se
