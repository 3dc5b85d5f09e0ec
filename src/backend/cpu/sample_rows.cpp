#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

namespace {

struct RowSample {
  int32_t token = 0;
  float logprob = 0.0f;
};

RowSample sample_row(std::span<const float> logits, const RowSampling& s, std::vector<int32_t>& order) {
  const auto vocab = static_cast<int32_t>(logits.size());
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double full_sum = 0.0;
  for (float x : logits) full_sum += std::exp(static_cast<double>(x - max_logit));

  const float inv_t = 1.0f / s.temperature;
  // min_p * p_max <=> scaled logit >= max_scaled + log(min_p).
  const float min_scaled =
      s.min_p > 0.0f ? max_logit * inv_t + std::log(s.min_p) : -std::numeric_limits<float>::infinity();
  order.clear();
  for (int32_t i = 0; i < vocab; ++i)
    if (logits[i] * inv_t >= min_scaled) order.push_back(i);
  int32_t keep = static_cast<int32_t>(order.size());
  if (s.top_k > 0 && s.top_k < keep) keep = s.top_k;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  auto prob = [&](int32_t i) {
    return std::exp(static_cast<double>(logits[order[static_cast<size_t>(i)]] - max_logit) * inv_t);
  };
  double total = 0.0;
  for (int32_t i = 0; i < keep; ++i) total += prob(i);
  if (s.top_p < 1.0f) {
    double cumulative = 0.0;
    for (int32_t i = 0; i < keep; ++i) {
      cumulative += prob(i);
      if (cumulative >= s.top_p * total) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_total = 0.0;
  for (int32_t i = 0; i < keep; ++i) kept_total += prob(i);
  const double target = s.u * kept_total;
  int32_t chosen = keep - 1;
  double cumulative = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    cumulative += prob(i);
    if (cumulative > target) {
      chosen = i;
      break;
    }
  }
  const int32_t token = order[static_cast<size_t>(chosen)];
  return {token, static_cast<float>(logits[token] - max_logit - std::log(full_sum))};
}

}  // namespace

void sample_rows(TensorView ids, TensorView logprobs, TensorView x, std::span<const RowSampling> rows) {
  const int64_t num_rows = ids.numel();
  const int64_t width = x.shape[x.shape.rank() - 1];
#pragma omp parallel for if (num_rows > 1)
  for (int64_t r = 0; r < num_rows; ++r) {
    std::vector<int32_t> order;
    order.reserve(static_cast<size_t>(width));
    const RowSample sample = sample_row(std::span<const float>(x.ptr<float>() + r * width, static_cast<size_t>(width)),
                                        rows[static_cast<size_t>(r)], order);
    ids.ptr<int32_t>()[r] = sample.token;
    logprobs.ptr<float>()[r] = sample.logprob;
  }
}

}  // namespace se::cpu
