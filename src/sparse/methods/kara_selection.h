// Kara's selection inside one sliding window (the seed's "Kara"; METHODS-2.md §1; our interpretation of what the
// text leaves open is written down in docs/fidelity.md, "Kara: our interpretation"). Plain functions on host
// buffers; no state, thread-compatible.
//
// A window is the W + P newest uncompressed tokens of a sequence: the compressible region (its first W tokens)
// and the protected buffer (its last P). Per (layer, KV head):
//   1. bidirectional scoring: every query of the window (all W + P, no causal mask) attends over the W keys of the
//      compressible region; softmax per query row and query head in fp32, mean over the rows, mean over the G
//      query heads of the KV head: s[j], j < W;
//   2. candidates: the K best tokens by s (ties: the lower index);
//   3. Token2Chunk: every two consecutive candidates a < b (in position order) with b > a + 1 bound a chunk [a, b],
//      scored (s[a] + s[b]) / 2 / L^gamma with L = b - a + 1; chunks are admitted best first (ties: the lower a)
//      while the kept count plus the chunk's b - a - 1 interior tokens stays within the budget R;
//   4. the rest of the budget goes to the best remaining tokens by s, so exactly min(R, W) tokens are kept.
#pragma once

#include <cstdint>
#include <vector>

namespace se {

struct KaraParams {
  int32_t window = 512;     // W: compressible tokens per compression
  int32_t buffer = 64;      // P: newest tokens of the window, never compressed
  int32_t candidates = 64;  // K: top tokens that seed Token2Chunk
  int32_t budget = 160;     // R: tokens the compressible region keeps (31% of 512, whole pages of 16)
  int32_t period = 128;     // decode steps between compression checks
  float length_exponent = 1.0f;  // gamma: how strongly a chunk's length lowers its score
};

// One (layer, KV head)'s outcome, in window-relative positions (0 = the first compressible token).
struct KaraSelection {
  std::vector<int32_t> kept;  // ascending, min(R, W) entries
  // Admitted chunks as [first, last] candidate pairs, ascending by first.
  std::vector<std::pair<int32_t, int32_t>> chunks;
};

// Step 1, the backend op bidirectional_window_scores (ops.h) on host buffers (its CPU twin).
// queries [num_queries, num_heads, head_dim]: the window's post-RoPE queries; keys [num_compressible,
// num_kv_heads, head_dim]: the compressible region's post-RoPE keys. Returns [num_kv_heads, num_compressible].
std::vector<float> kara_scores(const float* queries, int32_t num_queries, const float* keys,
                               int32_t num_compressible, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim);

// Steps 2-4 on one KV head's scores [n].
KaraSelection kara_select_tokens(const float* scores, int32_t n, const KaraParams& params);

// Steps 1-4 for every KV head of one layer.
std::vector<KaraSelection> kara_select(const float* queries, int32_t num_queries, const float* keys,
                                       int32_t num_compressible, int32_t num_heads, int32_t num_kv_heads,
                                       int32_t head_dim, const KaraParams& params);

// The periodic policy: a sequence compresses at decode steps that are multiples of the period, once it holds a
// whole window (W + P) of uncompressed tokens.
bool kara_should_compress(int64_t num_decoded_tokens, int64_t num_uncompressed_tokens, const KaraParams& params);

}  // namespace se
