#include "sparse/methods/kara_selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/ops.h"
#include "base/top_k.h"

namespace se {

std::vector<float> kara_scores(const float* queries, int32_t num_queries, const float* keys,
                               int32_t num_compressible, int32_t num_heads, int32_t num_kv_heads, int32_t head_dim) {
  std::vector<float> out(static_cast<size_t>(num_kv_heads) * num_compressible);
  // TensorView holds a mutable pointer; the op only reads queries and keys.
  bidirectional_window_scores(
      TensorView{out.data(), DType::kF32, {num_kv_heads, num_compressible}, Device::kCpu},
      TensorView{const_cast<float*>(queries), DType::kF32, {num_queries, num_heads, head_dim}, Device::kCpu},
      TensorView{const_cast<float*>(keys), DType::kF32, {num_compressible, num_kv_heads, head_dim}, Device::kCpu});
  return out;
}

KaraSelection kara_select_tokens(const float* scores, int32_t n, const KaraParams& params) {
  const int32_t budget = std::min(params.budget, n);
  KaraSelection sel;
  std::vector<int32_t> candidates;
  top_k_ascending(scores, n, std::min(params.candidates, budget), candidates);
  std::vector<char> kept(static_cast<size_t>(n), 0);
  for (int32_t c : candidates) kept[c] = 1;
  int32_t num_kept = static_cast<int32_t>(candidates.size());

  struct Chunk {
    double score;
    int32_t first, last;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i + 1 < candidates.size(); ++i) {
    const int32_t a = candidates[i], b = candidates[i + 1];
    if (b == a + 1) continue;  // nothing between them to keep
    const double length = b - a + 1;
    chunks.push_back({(static_cast<double>(scores[a]) + scores[b]) / 2.0 / std::pow(length, params.length_exponent),
                      a, b});
  }
  std::stable_sort(chunks.begin(), chunks.end(), [](const Chunk& x, const Chunk& y) { return x.score > y.score; });
  for (const Chunk& c : chunks) {
    const int32_t interior = c.last - c.first - 1;
    if (num_kept + interior > budget) continue;
    for (int32_t t = c.first + 1; t < c.last; ++t) kept[t] = 1;
    num_kept += interior;
    sel.chunks.emplace_back(c.first, c.last);
  }
  std::sort(sel.chunks.begin(), sel.chunks.end());

  // Fill: the best tokens not yet kept, ties to the lower index.
  std::vector<int32_t> rest(static_cast<size_t>(n));
  std::iota(rest.begin(), rest.end(), 0);
  std::stable_sort(rest.begin(), rest.end(), [&](int32_t x, int32_t y) { return scores[x] > scores[y]; });
  for (int32_t t : rest) {
    if (num_kept >= budget) break;
    if (!kept[t]) kept[t] = 1, ++num_kept;
  }
  for (int32_t t = 0; t < n; ++t)
    if (kept[t]) sel.kept.push_back(t);
  return sel;
}

std::vector<KaraSelection> kara_select(const float* queries, int32_t num_queries, const float* keys,
                                       int32_t num_compressible, int32_t num_heads, int32_t num_kv_heads,
                                       int32_t head_dim, const KaraParams& params) {
  const std::vector<float> scores =
      kara_scores(queries, num_queries, keys, num_compressible, num_heads, num_kv_heads, head_dim);
  std::vector<KaraSelection> out;
  out.reserve(static_cast<size_t>(num_kv_heads));
  for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh)
    out.push_back(kara_select_tokens(scores.data() + static_cast<size_t>(kvh) * num_compressible, num_compressible,
                                     params));
  return out;
}

bool kara_should_compress(int64_t num_decoded_tokens, int64_t num_uncompressed_tokens, const KaraParams& params) {
  return num_decoded_tokens > 0 && num_decoded_tokens % params.period == 0 &&
         num_uncompressed_tokens >= params.window + params.buffer;
}

}  // namespace se
