#include "sparse/methods/shadowkv_sketch.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "base/top_k.h"
#include "sparse/thin_svd.h"

namespace se {
namespace {

// Step 1. In double: the reference factors fp32 keys, and the rank-r subspace of near-equal singular values is
// sensitive to rounding.
void factor_keys(const float* pre_rope_keys, ShadowKvLayerSketch& s) {
  const int n = s.num_tokens, width = s.num_kv_heads * s.head_dim;
  const std::vector<double> keys(pre_rope_keys, pre_rope_keys + static_cast<size_t>(n) * width);
  const ThinSvd svd = thin_svd(keys, n, width);
  const int k = svd.k;
  const int r = s.rank;
  s.u.resize(static_cast<size_t>(n) * r);
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < r; ++j)
      s.u[static_cast<size_t>(t) * r + j] = static_cast<float>(svd.u[static_cast<size_t>(t) * k + j]);
  s.sv.resize(static_cast<size_t>(s.num_kv_heads) * r * s.head_dim);
  for (int h = 0; h < s.num_kv_heads; ++h)
    for (int j = 0; j < r; ++j)
      for (int c = 0; c < s.head_dim; ++c)
        s.sv[(static_cast<size_t>(h) * r + j) * s.head_dim + c] = static_cast<float>(
            svd.sigma[j] * svd.vt[static_cast<size_t>(j) * width + static_cast<size_t>(h) * s.head_dim + c]);
}

// Steps 2-3 for one KV head.
void sketch_head(const float* post_rope_keys, int32_t kv_head, const ShadowKvParams& params, ShadowKvLayerSketch& s) {
  const int32_t d = s.head_dim, cs = s.chunk_size;
  const int64_t stride = static_cast<int64_t>(s.num_kv_heads) * d;
  std::vector<float> means(static_cast<size_t>(s.num_chunks) * d), spread(static_cast<size_t>(s.num_chunks));
  for (int32_t c = 0; c < s.num_chunks; ++c) {
    float* mean = means.data() + static_cast<size_t>(c) * d;
    std::vector<double> acc(static_cast<size_t>(d), 0.0);
    for (int32_t i = 0; i < cs; ++i) {
      const float* key =
          post_rope_keys + (static_cast<int64_t>(c) * cs + i) * stride + static_cast<int64_t>(kv_head) * d;
      for (int32_t e = 0; e < d; ++e) acc[e] += key[e];
    }
    double mean_norm = 0;
    for (int32_t e = 0; e < d; ++e) {
      mean[e] = static_cast<float>(acc[e] / cs);
      mean_norm += static_cast<double>(mean[e]) * mean[e];
    }
    // torch.nn.functional.cosine_similarity: each norm clamped below at 1e-8.
    mean_norm = std::max(std::sqrt(mean_norm), 1e-8);
    double least = INFINITY;
    for (int32_t i = 0; i < cs; ++i) {
      const float* key =
          post_rope_keys + (static_cast<int64_t>(c) * cs + i) * stride + static_cast<int64_t>(kv_head) * d;
      double dot = 0, norm = 0;
      for (int32_t e = 0; e < d; ++e) {
        dot += static_cast<double>(mean[e]) * key[e];
        norm += static_cast<double>(key[e]) * key[e];
      }
      least = std::min(least, dot / (mean_norm * std::max(std::sqrt(norm), 1e-8)));
    }
    spread[c] = static_cast<float>(-least);  // top-k of the negation: the least similar chunks
  }
  std::vector<int32_t>& outliers = s.outliers[kv_head];
  top_k_ascending(spread.data(), s.num_chunks, params.outlier_chunks, outliers);
  std::vector<int32_t>& chunks = s.landmark_chunks[kv_head];
  std::vector<float>& landmarks = s.landmarks[kv_head];
  size_t next_outlier = 0;
  for (int32_t c = 0; c < s.num_chunks; ++c) {
    if (next_outlier < outliers.size() && outliers[next_outlier] == c) {
      ++next_outlier;
      continue;
    }
    chunks.push_back(c);
    landmarks.insert(landmarks.end(), means.begin() + static_cast<int64_t>(c) * d,
                     means.begin() + static_cast<int64_t>(c + 1) * d);
  }
}

}  // namespace

bool shadowkv_can_sketch(int32_t num_tokens, const ShadowKvParams& params) {
  if (params.rank <= 0 || params.chunk_size <= 0 || params.sparse_budget <= 0 || params.local_chunks < 0 ||
      params.outlier_chunks < 0 || params.sparse_budget % params.chunk_size != 0)
    return false;
  const int64_t chunks = num_tokens / params.chunk_size - params.local_chunks;
  return chunks - params.outlier_chunks >= params.sparse_budget / params.chunk_size;
}

ShadowKvLayerSketch shadowkv_sketch(const float* pre_rope_keys, const float* post_rope_keys, int32_t num_tokens,
                                    int32_t num_kv_heads, int32_t head_dim, const ShadowKvParams& params) {
  SE_CHECK(shadowkv_can_sketch(num_tokens, params), "ShadowKV cannot sketch a prompt of {} tokens", num_tokens);
  ShadowKvLayerSketch s;
  s.num_tokens = num_tokens;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.rank = std::min({params.rank, num_tokens, num_kv_heads * head_dim});
  s.chunk_size = params.chunk_size;
  s.num_chunks = num_tokens / params.chunk_size - params.local_chunks;
  factor_keys(pre_rope_keys, s);
  s.outliers.resize(static_cast<size_t>(num_kv_heads));
  s.landmark_chunks.resize(static_cast<size_t>(num_kv_heads));
  s.landmarks.resize(static_cast<size_t>(num_kv_heads));
  for (int32_t h = 0; h < num_kv_heads; ++h) sketch_head(post_rope_keys, h, params, s);
  return s;
}

ShadowKvLayerSketch shadowkv_sketch_heads(ShadowKvLayerSketch sketch, int32_t first, int32_t count) {
  SE_CHECK(first >= 0 && count >= 0 && first + count <= sketch.num_kv_heads, "KV heads [{}, {}) of a sketch of {}",
           first, first + count, sketch.num_kv_heads);
  const auto keep = [first, count](auto& per_head) {
    per_head.erase(per_head.begin() + first + count, per_head.end());
    per_head.erase(per_head.begin(), per_head.begin() + first);
  };
  keep(sketch.outliers);
  keep(sketch.landmark_chunks);
  keep(sketch.landmarks);
  const auto head_size = static_cast<int64_t>(sketch.rank) * sketch.head_dim;  // of sv
  if (!sketch.sv.empty())
    sketch.sv =
        std::vector<float>(sketch.sv.begin() + first * head_size, sketch.sv.begin() + (first + count) * head_size);
  sketch.num_kv_heads = count;
  return sketch;
}

std::vector<std::vector<float>> shadowkv_chunk_scores(const ShadowKvLayerSketch& sketch, const float* queries,
                                                      int32_t num_queries, int32_t num_heads) {
  const int32_t d = sketch.head_dim, group = num_heads / sketch.num_kv_heads;
  SE_CHECK(group * sketch.num_kv_heads == num_heads, "{} query heads over {} KV heads", num_heads, sketch.num_kv_heads);
  // The reference divides by sqrt(128) whatever the head size (its models all have d = 128); we keep its constant,
  // since the softmax's temperature changes which chunks the sum and max favour.
  const double scale = 1.0 / std::sqrt(128.0);
  std::vector<std::vector<float>> out(static_cast<size_t>(sketch.num_kv_heads));
  for (int32_t kvh = 0; kvh < sketch.num_kv_heads; ++kvh) {
    const std::vector<float>& marks = sketch.landmarks[kvh];
    const size_t m = sketch.landmark_chunks[kvh].size();
    std::vector<double> best(m, -INFINITY), summed(m), row(m);
    for (int32_t g = 0; g < group; ++g) {
      std::fill(summed.begin(), summed.end(), 0.0);
      for (int32_t r = 0; r < num_queries; ++r) {
        const float* q = queries + (static_cast<int64_t>(r) * num_heads + kvh * group + g) * d;
        double top = -INFINITY;
        for (size_t j = 0; j < m; ++j) {
          double dot = 0;
          for (int32_t e = 0; e < d; ++e) dot += static_cast<double>(q[e]) * marks[j * d + e];
          top = std::max(top, row[j] = dot * scale);
        }
        double sum = 0;
        for (double& x : row) sum += (x = std::exp(x - top));
        for (size_t j = 0; j < m; ++j) summed[j] += row[j] / sum;
      }
      for (size_t j = 0; j < m; ++j) best[j] = std::max(best[j], summed[j]);
    }
    out[kvh].assign(best.begin(), best.end());
  }
  return out;
}

std::vector<std::vector<int32_t>> shadowkv_select_chunks(const std::vector<std::vector<float>>& scores,
                                                         const ShadowKvLayerSketch& sketch,
                                                         const ShadowKvParams& params) {
  std::vector<std::vector<int32_t>> out(scores.size());
  for (size_t h = 0; h < scores.size(); ++h) {
    const std::vector<int32_t> picked = top_k_ascending(scores[h].data(), static_cast<int32_t>(scores[h].size()),
                                                        params.sparse_budget / params.chunk_size);
    // landmark_chunks ascends, so the chunk ids keep the landmark indices' order.
    for (int32_t j : picked) out[h].push_back(sketch.landmark_chunks[h][j]);
  }
  return out;
}

void shadowkv_rebuild_keys(const ShadowKvLayerSketch& sketch, int32_t kv_head, const std::vector<int32_t>& chunks,
                           float* out) {
  const int32_t r = sketch.rank, d = sketch.head_dim;
  const float* sv = sketch.sv.data() + static_cast<size_t>(kv_head) * r * d;
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (int32_t j = 0; j < sketch.chunk_size; ++j) {
      const int64_t t = static_cast<int64_t>(chunks[i]) * sketch.chunk_size + j;
      const float* u = sketch.u.data() + t * r;
      float* row = out + (static_cast<int64_t>(i) * sketch.chunk_size + j) * d;
      for (int32_t e = 0; e < d; ++e) {
        double acc = 0;
        for (int32_t k = 0; k < r; ++k) acc += static_cast<double>(u[k]) * sv[static_cast<int64_t>(k) * d + e];
        row[e] = static_cast<float>(acc);
      }
    }
  }
}

std::vector<int32_t> shadowkv_exact_positions(const ShadowKvLayerSketch& sketch, int32_t kv_head) {
  std::vector<int32_t> out;
  for (int32_t c : sketch.outliers[kv_head])
    for (int32_t j = 0; j < sketch.chunk_size; ++j) out.push_back(c * sketch.chunk_size + j);
  for (int32_t t = sketch.local_begin(); t < sketch.num_tokens; ++t) out.push_back(t);
  return out;
}

}  // namespace se
