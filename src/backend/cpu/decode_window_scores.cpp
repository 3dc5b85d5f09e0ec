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

struct Dims {
  int64_t rows, num_heads, num_kv_heads, head_dim, n, group;
};

Dims dims_of(TensorView queries, TensorView keys) {
  const Dims d{queries.shape[0], queries.shape[1], keys.shape[1], keys.shape[2], keys.shape[0], 0};
  return Dims{d.rows, d.num_heads, d.num_kv_heads, d.head_dim, d.n, d.num_heads / d.num_kv_heads};
}

}  // namespace

void bidirectional_window_scores(TensorView out, TensorView queries, TensorView keys) {
  const Dims d = dims_of(queries, keys);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  const float* q_all = queries.ptr<float>();
  const float* k_all = keys.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t kvh = 0; kvh < d.num_kv_heads; ++kvh) {
    std::vector<double> row(static_cast<size_t>(d.n)), acc(static_cast<size_t>(d.n), 0.0);
    for (int64_t g = 0; g < d.group; ++g) {
      const int64_t h = kvh * d.group + g;
      for (int64_t r = 0; r < d.rows; ++r) {
        const float* q = q_all + (r * d.num_heads + h) * d.head_dim;
        double top = -INFINITY;
        for (int64_t j = 0; j < d.n; ++j)
          top = std::max(top, row[j] = dot(q, k_all + (j * d.num_kv_heads + kvh) * d.head_dim, d.head_dim) * scale);
        double sum = 0;
        for (double& x : row) sum += (x = std::exp(x - top));
        for (int64_t j = 0; j < d.n; ++j) acc[j] += row[j] / sum;
      }
    }
    const double divisor = static_cast<double>(d.rows) * d.group;
    for (int64_t j = 0; j < d.n; ++j) out.ptr<float>()[kvh * d.n + j] = static_cast<float>(acc[j] / divisor);
  }
}

void group_max_attention_importance(TensorView out, TensorView queries, TensorView keys) {
  const Dims d = dims_of(queries, keys);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  const float* q_all = queries.ptr<float>();
  const float* k_all = keys.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t kvh = 0; kvh < d.num_kv_heads; ++kvh) {
    std::vector<double> logits(static_cast<size_t>(d.n)), mean(static_cast<size_t>(d.n), 0.0);
    for (int64_t r = 0; r < d.rows; ++r) {
      std::fill(logits.begin(), logits.end(), -std::numeric_limits<double>::infinity());
      for (int64_t g = 0; g < d.group; ++g) {
        const float* q = q_all + (r * d.num_heads + kvh * d.group + g) * d.head_dim;
        for (int64_t j = 0; j < d.n; ++j)
          logits[j] = std::max(logits[j], dot(q, k_all + (j * d.num_kv_heads + kvh) * d.head_dim, d.head_dim) * scale);
      }
      softmax_row(logits);
      for (int64_t j = 0; j < d.n; ++j) mean[j] += logits[j];
    }
    for (int64_t j = 0; j < d.n; ++j)
      out.ptr<float>()[kvh * d.n + j] = static_cast<float>(mean[j] / static_cast<double>(d.rows));
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
