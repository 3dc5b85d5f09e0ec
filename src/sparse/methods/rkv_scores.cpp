#include "sparse/methods/rkv_scores.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/top_k.h"
#include "sparse/methods/observation_window_scores.h"

namespace se {
namespace {

double dot(const float* a, const float* b, int32_t n) {
  double acc = 0;
  for (int32_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}

// In place: row[j] = softmax over j < n, in double.
void softmax_row(std::vector<double>& row) {
  const double top = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (double& x : row) sum += (x = std::exp(x - top));
  for (double& x : row) x /= sum;
}

}  // namespace

std::vector<float> rkv_redundancy(const float* keys, int32_t num_tokens, int32_t num_kv_heads, int32_t kv_head,
                                  int32_t head_dim, float threshold) {
  const int64_t stride = static_cast<int64_t>(num_kv_heads) * head_dim;
  std::vector<float> unit(static_cast<size_t>(num_tokens) * head_dim);  // [T, head_dim]
  for (int32_t t = 0; t < num_tokens; ++t) {
    const float* k = keys + t * stride + static_cast<int64_t>(kv_head) * head_dim;
    const double norm = std::sqrt(dot(k, k, head_dim)) + 1e-8;
    float* u = unit.data() + static_cast<size_t>(t) * head_dim;
    for (int32_t c = 0; c < head_dim; ++c) u[c] = static_cast<float>(k[c] / norm);
  }
  // Column sums of S with each row's newest near-duplicate cleared, built row by row so only one row is held.
  std::vector<double> column_sum(static_cast<size_t>(num_tokens), 0.0), row(static_cast<size_t>(num_tokens));
  for (int32_t i = 0; i < num_tokens; ++i) {
    const float* ki = unit.data() + static_cast<size_t>(i) * head_dim;
    int32_t newest = 0;
    for (int32_t j = 0; j < num_tokens; ++j) {
      row[j] = i == j ? 0.0 : dot(ki, unit.data() + static_cast<size_t>(j) * head_dim, head_dim);
      if (row[j] > threshold) newest = j;
    }
    row[newest] = 0.0;
    for (int32_t j = 0; j < num_tokens; ++j) column_sum[j] += row[j];
  }
  for (double& x : column_sum) x /= num_tokens;
  softmax_row(column_sum);
  return {column_sum.begin(), column_sum.end()};
}

RkvScores rkv_scores(const float* queries, const float* keys, int32_t num_tokens, int32_t num_heads,
                     int32_t num_kv_heads, int32_t head_dim, const RkvParams& params) {
  const int32_t w = params.window, n = num_tokens - w, group = num_heads / num_kv_heads;
  RkvScores s{num_kv_heads, n, std::vector<float>(static_cast<size_t>(num_kv_heads) * n)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const int64_t k_stride = static_cast<int64_t>(num_kv_heads) * head_dim;
  const int64_t q_stride = static_cast<int64_t>(num_heads) * head_dim;
  std::vector<double> logits(static_cast<size_t>(n));
  std::vector<float> importance(static_cast<size_t>(n)), pooled(static_cast<size_t>(n));
  for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    std::vector<double> mean(static_cast<size_t>(n), 0.0);
    for (int32_t r = 0; r < w; ++r) {
      std::fill(logits.begin(), logits.end(), -std::numeric_limits<double>::infinity());
      for (int32_t g = 0; g < group; ++g) {
        const float* q = queries + r * q_stride + static_cast<int64_t>(kvh * group + g) * head_dim;
        for (int32_t j = 0; j < n; ++j)
          logits[j] = std::max(logits[j], dot(q, keys + j * k_stride + static_cast<int64_t>(kvh) * head_dim,
                                              head_dim) * scale);
      }
      softmax_row(logits);
      for (int32_t j = 0; j < n; ++j) mean[j] += logits[j];
    }
    for (int32_t j = 0; j < n; ++j) importance[j] = static_cast<float>(mean[j] / w);
    pool_scores(importance.data(), pooled.data(), n, params.kernel, WindowPooling::kMax);
    const std::vector<float> redundancy =
        rkv_redundancy(keys, num_tokens, num_kv_heads, kvh, head_dim, params.similarity_threshold);
    float* out = s.values.data() + static_cast<size_t>(kvh) * n;
    for (int32_t j = 0; j < n; ++j)
      out[j] = params.mix_lambda * pooled[j] - (1.0f - params.mix_lambda) * redundancy[j];
  }
  return s;
}

std::vector<std::vector<int32_t>> rkv_select(const float* queries, const float* keys, int32_t num_tokens,
                                             int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                                             const RkvParams& params) {
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(num_kv_heads));
  if (num_tokens <= params.budget) {
    for (auto& k : kept) {
      k.resize(static_cast<size_t>(num_tokens));
      for (int32_t t = 0; t < num_tokens; ++t) k[t] = t;
    }
    return kept;
  }
  const RkvScores s = rkv_scores(queries, keys, num_tokens, num_heads, num_kv_heads, head_dim, params);
  for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    top_k_ascending(s.values.data() + static_cast<size_t>(kvh) * s.num_prefix, s.num_prefix,
                    params.budget - params.window, kept[kvh]);
    for (int32_t t = s.num_prefix; t < num_tokens; ++t) kept[kvh].push_back(t);
  }
  return kept;
}

bool rkv_should_compress(int64_t resident_tokens, int64_t num_decoded_tokens, int64_t num_new_tokens,
                         const RkvParams& params) {
  if (num_new_tokens <= 0 || num_decoded_tokens <= 0) return false;
  if (resident_tokens < params.budget + params.buffer) return false;
  const int64_t before = std::max<int64_t>(0, num_decoded_tokens - num_new_tokens);
  return num_decoded_tokens / params.buffer > before / params.buffer;
}

}  // namespace se
