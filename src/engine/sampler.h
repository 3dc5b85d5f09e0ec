// Sampler: turns one row of logits into a token under a request's SamplingParams (temperature, then min-p and
// top-k, then top-p, as vLLM applies them), plus the logprobs the request asked for. Each request owns its
// random state (seeded when `seed` is set), so results do not depend on what else is batched with it.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace se {

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token_id = 0;
  float logprob = 0.0f;               // of the sampled token under the model's (unscaled) distribution
  std::vector<TokenLogprob> top;      // the top-N alternatives when requested, best first
};

class RequestSampler {
 public:
  explicit RequestSampler(const SamplingParams& params);

  // logits [vocab] (modified: scratch use). Precondition: params validated.
  SampleResult sample(std::span<float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;  // scratch: candidate ids
};

}  // namespace se
