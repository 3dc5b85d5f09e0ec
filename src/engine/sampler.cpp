#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/ops.h"

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
    : params_(params), rng_(params.seed ? *params.seed : std::random_device{}()) {
  if (params_.grammar) matcher_.emplace(params_.grammar);
}

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
  if (matcher_) matcher_->mask_logits(logits);

  if (params_.greedy()) {
    result.token_id = argmax(logits);
    result.logprob = raw.logprob(logits[result.token_id]);
  } else {
    RowSampling row = row_sampling();
    int32_t token = 0;
    TensorView x{logits.data(), DType::kF32, {1, vocab}};
    TensorView ids{&token, DType::kI32, {1}};
    TensorView logprob{&result.logprob, DType::kF32, {1}};
    sample_rows(ids, logprob, x, std::span<const RowSampling>(&row, 1));
    result.token_id = token;
  }
  if (matcher_) {
    // The mask leaves allowed logits as they were: the logprob is the model's, not the masked row's.
    result.logprob = raw.logprob(logits[result.token_id]);
    matcher_->accept(result.token_id);
  }
  return result;
}

RowSampling RequestSampler::row_sampling() {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  return {params_.temperature, params_.top_k, params_.top_p, params_.min_p, uniform(rng_)};
}

}  // namespace se
