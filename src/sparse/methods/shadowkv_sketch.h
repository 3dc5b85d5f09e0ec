// ShadowKV's sketch of a prompt and how a decode step reads it, as its reference code (bytedance/ShadowKV,
// ShadowKVCache) does it; where that code says more than the paper, or we differ, docs/fidelity.md "ShadowKV" says
// so. Plain functions on host buffers; a sketch is immutable once built, so concurrent readers are safe.
//
// Per layer, at prefill over the prompt's n tokens:
//   1. low rank: the pre-RoPE keys of all KV heads side by side, K [n, Hkv * d], factored by SVD; the first r
//      left singular vectors U [n, r] are shared by the heads and S V^T is split per head into SV [Hkv, r, d];
//   2. chunks: the first C = n / chunk_size - local_chunks whole chunks of chunk_size tokens; the rest (the last
//      local_chunks chunks and the remainder) is the local window, kept exact;
//   3. landmarks: per KV head and chunk, the mean of its post-RoPE keys; a chunk's spread is the least cosine
//      similarity between its landmark and one of its keys; the outlier_chunks chunks of least spread per head
//      are kept exact, the others keep only their landmark.
// At a decode step, per KV head: every query head of the group takes softmax(q . landmark / sqrt(128)) over the
// landmarks, summed over the step's query rows; the heads of the group are merged by max; the best
// sparse_budget / chunk_size chunks are read, their keys rebuilt as U[t] SV[h] and rotated at t, their values read
// exact. Attention then reads local window + outlier chunks + chosen chunks + the tokens decoded since the prompt.
#pragma once

#include <cstdint>
#include <vector>

namespace se {

struct ShadowKvParams {
  int32_t sparse_budget = 2048;  // tokens rebuilt per decode step: sparse_budget / chunk_size chunks
  int32_t chunk_size = 8;
  int32_t rank = 160;
  int32_t local_chunks = 4;     // newest whole chunks kept exact, beside the remainder of the last chunk
  int32_t outlier_chunks = 48;  // chunks per KV head kept exact because their landmark represents them badly
};

// One layer's sketch of an n-token prompt.
struct ShadowKvLayerSketch {
  int32_t num_tokens = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t rank = 0;  // min(params.rank, n, Hkv * d)
  int32_t chunk_size = 0;
  int32_t num_chunks = 0;  // C: chunks [0, C) are sketched, tokens [C * chunk_size, n) are the local window
  std::vector<float> u;    // [n, rank]
  std::vector<float> sv;   // [Hkv, rank, d]
  // Per KV head: its outlier chunks, ascending, and the other chunks' landmarks in chunk order.
  std::vector<std::vector<int32_t>> outliers;         // [Hkv][outliers]
  std::vector<std::vector<int32_t>> landmark_chunks;  // [Hkv][C - outliers]
  std::vector<std::vector<float>> landmarks;          // [Hkv][C - outliers, d]

  int32_t local_begin() const { return num_chunks * chunk_size; }
};

// Whether params can sketch an n-token prompt: rank, chunk size and budget positive, the budget whole chunks, and
// at least as many landmarks (sketched chunks less outliers) as the chunks a step reads (the reference's top-k
// needs as much).
bool shadowkv_can_sketch(int32_t num_tokens, const ShadowKvParams& params);

// Steps 1-3. pre_rope_keys, post_rope_keys [n, Hkv, d]. Requires shadowkv_can_sketch.
ShadowKvLayerSketch shadowkv_sketch(const float* pre_rope_keys, const float* post_rope_keys, int32_t num_tokens,
                                    int32_t num_kv_heads, int32_t head_dim, const ShadowKvParams& params);

// The part of `sketch` that its KV heads [first, first + count) read: what a tensor-parallel rank holding those heads
// keeps of a sketch over the layer's every head (U, shared by the heads, stays whole).
ShadowKvLayerSketch shadowkv_sketch_heads(ShadowKvLayerSketch sketch, int32_t first, int32_t count);

// The landmark scores of one decode step: queries [num_queries, H, d] (post-RoPE). Returns per KV head one score
// per landmark (in landmark_chunks order).
std::vector<std::vector<float>> shadowkv_chunk_scores(const ShadowKvLayerSketch& sketch, const float* queries,
                                                      int32_t num_queries, int32_t num_heads);

// The chunks a step reads per KV head: the best sparse_budget / chunk_size landmarks by score (ties: the lower
// chunk), as ascending chunk ids.
std::vector<std::vector<int32_t>> shadowkv_select_chunks(const std::vector<std::vector<float>>& scores,
                                                         const ShadowKvLayerSketch& sketch,
                                                         const ShadowKvParams& params);

// Pre-RoPE keys rebuilt for one KV head's chunks: out [chunks.size() * chunk_size, d], the tokens of each chunk in
// order. The caller rotates row i at its position.
void shadowkv_rebuild_keys(const ShadowKvLayerSketch& sketch, int32_t kv_head, const std::vector<int32_t>& chunks,
                           float* out);

// The prompt positions one KV head reads exact (outlier chunks and local window), ascending.
std::vector<int32_t> shadowkv_exact_positions(const ShadowKvLayerSketch& sketch, int32_t kv_head);

}  // namespace se
