#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace se {

namespace {

// log_softmax of one logit, given the row's max and log-sum-exp.
struct LogNormalizer {
  float max = 0.0f;
  double log_sum = 0.0;
  float logprob(float logit) const { return static_cast<float>(logit - max - log_sum); }
};

LogNormalizer normalizer_of(std::span<const float> logits) {
  LogNormalizer n;
  n.max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - n.max));
  n.log_sum = std::log(sum);
  return n;
}

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

RequestSampler::RequestSampler(const SamplingParams& params)
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {}

SampleResult RequestSampler::sample(std::span<float> logits) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  SampleResult result;
  const LogNormalizer raw = normalizer_of(logits);
  if (params_.logprobs >= 0) {
    const int n = std::min<int>(params_.logprobs, vocab);
    order_.resize(static_cast<size_t>(vocab));
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int i = 0; i < n; ++i)
      result.top.push_back({order_[static_cast<size_t>(i)], raw.logprob(logits[order_[static_cast<size_t>(i)]])});
  }

  if (params_.greedy()) {
    result.token_id = argmax(logits);
    result.logprob = raw.logprob(logits[result.token_id]);
    return result;
  }

  // vLLM's order on the temperature-scaled distribution: min-p and top-k keep a prefix of the tokens sorted by
  // logit, then top-p keeps the smallest prefix of that whose renormalized mass reaches top_p.
  const float inv_t = 1.0f / params_.temperature;
  const float max_logit = raw.max;
  order_.clear();
  // min_p * p_max <=> scaled logit >= max_scaled + log(min_p).
  const float min_scaled = params_.min_p > 0.0f ? max_logit * inv_t + std::log(params_.min_p)
                                                : -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < vocab; ++i)
    if (logits[i] * inv_t >= min_scaled) order_.push_back(i);
  int32_t keep = static_cast<int32_t>(order_.size());
  if (params_.top_k > 0 && params_.top_k < keep) keep = params_.top_k;
  std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> probs(static_cast<size_t>(keep));
  double total = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    probs[static_cast<size_t>(i)] =
        std::exp(static_cast<double>(logits[order_[static_cast<size_t>(i)]] - max_logit) * inv_t);
    total += probs[static_cast<size_t>(i)];
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    for (int32_t i = 0; i < keep; ++i) {
      cumulative += probs[static_cast<size_t>(i)] / total;
      if (cumulative >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept_total = 0.0;
  for (int32_t i = 0; i < keep; ++i) kept_total += probs[static_cast<size_t>(i)];
  std::uniform_real_distribution<double> uniform(0.0, kept_total);
  double r = uniform(rng_);
  int32_t chosen = keep - 1;
  for (int32_t i = 0; i < keep; ++i) {
    r -= probs[static_cast<size_t>(i)];
    if (r < 0.0) {
      chosen = i;
      break;
    }
  }
  result.token_id = order_[static_cast<size_t>(chosen)];
  result.logprob = raw.logprob(logits[result.token_id]);
  return result;
}

}  // namespace se
