// The decode-time compression scores over gathered keys (ops.h: bidirectional_window_scores,
// group_max_attention_importance, key_redundancy): dot products and softmaxes in double, so the methods' numpy
// oracles (tests/sparse/oracles) agree with them exactly in their rankings. One KV head per OpenMP task.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {
namespace {

double dot(const float* a, const float* b, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}

// In place: row = softmax(row), in double.
void softmax_row(std::vector<double>& row) {
  const double top = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (double& x : row) sum += (x = std::exp(x - top));
  for (double& x : row) x /= sum;
}

// Scaled query-key logits over gathered keys: queries [rows, num_heads, head_dim], keys [n, num_kv_heads, head_dim].
struct WindowLogits {
  int64_t rows, num_heads, num_kv_heads, head_dim, n, group;
  double scale;
  const float* queries;
  const float* keys;

  WindowLogits(TensorView q, TensorView k)
      : rows(q.shape[0]),
        num_heads(q.shape[1]),
        num_kv_heads(k.shape[1]),
        head_dim(k.shape[2]),
        n(k.shape[0]),
        group(num_heads / num_kv_heads),
        scale(1.0 / std::sqrt(static_cast<double>(head_dim))),
        queries(q.ptr<float>()),
        keys(k.ptr<float>()) {}

  // Query row `r` of head `head` against key `j` of its KV head.
  double operator()(int64_t r, int64_t head, int64_t j) const {
    return dot(queries + (r * num_heads + head) * head_dim, keys + (j * num_kv_heads + head / group) * head_dim,
               head_dim) *
           scale;
  }
};

}  // namespace

void bidirectional_window_scores(TensorView out, TensorView queries, TensorView keys) {
  const WindowLogits logit(queries, keys);
#pragma omp parallel for schedule(static)
  for (int64_t kvh = 0; kvh < logit.num_kv_heads; ++kvh) {
    std::vector<double> row(static_cast<size_t>(logit.n)), acc(static_cast<size_t>(logit.n), 0.0);
    for (int64_t h = kvh * logit.group; h < (kvh + 1) * logit.group; ++h) {
      for (int64_t r = 0; r < logit.rows; ++r) {
        for (int64_t j = 0; j < logit.n; ++j) row[j] = logit(r, h, j);
        softmax_row(row);
        for (int64_t j = 0; j < logit.n; ++j) acc[j] += row[j];
      }
    }
    const double divisor = static_cast<double>(logit.rows) * logit.group;
    for (int64_t j = 0; j < logit.n; ++j) out.ptr<float>()[kvh * logit.n + j] = static_cast<float>(acc[j] / divisor);
  }
}

void group_max_attention_importance(TensorView out, TensorView queries, TensorView keys) {
  const WindowLogits logit(queries, keys);
#pragma omp parallel for schedule(static)
  for (int64_t kvh = 0; kvh < logit.num_kv_heads; ++kvh) {
    std::vector<double> row(static_cast<size_t>(logit.n)), mean(static_cast<size_t>(logit.n), 0.0);
    for (int64_t r = 0; r < logit.rows; ++r) {
      std::fill(row.begin(), row.end(), -std::numeric_limits<double>::infinity());
      for (int64_t h = kvh * logit.group; h < (kvh + 1) * logit.group; ++h)
        for (int64_t j = 0; j < logit.n; ++j) row[j] = std::max(row[j], logit(r, h, j));
      softmax_row(row);
      for (int64_t j = 0; j < logit.n; ++j) mean[j] += row[j];
    }
    for (int64_t j = 0; j < logit.n; ++j)
      out.ptr<float>()[kvh * logit.n + j] = static_cast<float>(mean[j] / static_cast<double>(logit.rows));
  }
}

void key_redundancy(TensorView out, TensorView keys, float threshold) {
  const int64_t num_tokens = keys.shape[0], num_kv_heads = keys.shape[1], head_dim = keys.shape[2];
  const float* k_all = keys.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    std::vector<float> unit(static_cast<size_t>(num_tokens * head_dim));  // [T, head_dim]
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* k = k_all + (t * num_kv_heads + kvh) * head_dim;
      const double norm = std::sqrt(dot(k, k, head_dim)) + 1e-8;
      float* u = unit.data() + t * head_dim;
      for (int64_t c = 0; c < head_dim; ++c) u[c] = static_cast<float>(k[c] / norm);
    }
    // Column sums of S with each row's newest near-duplicate cleared, built row by row so only one row is held.
    std::vector<double> column_sum(static_cast<size_t>(num_tokens), 0.0), row(static_cast<size_t>(num_tokens));
    for (int64_t i = 0; i < num_tokens; ++i) {
      const float* ki = unit.data() + i * head_dim;
      int64_t newest = 0;
      for (int64_t j = 0; j < num_tokens; ++j) {
        row[j] = i == j ? 0.0 : dot(ki, unit.data() + j * head_dim, head_dim);
        if (row[j] > threshold) newest = j;
      }
      row[newest] = 0.0;
      for (int64_t j = 0; j < num_tokens; ++j) column_sum[j] += row[j];
    }
    for (double& x : column_sum) x /= static_cast<double>(num_tokens);
    softmax_row(column_sum);
    for (int64_t j = 0; j < num_tokens; ++j) out.ptr<float>()[kvh * num_tokens + j] = static_cast<float>(column_sum[j]);
  }
}

}  // namespace se::cpu
