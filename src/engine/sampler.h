// Sampler: turns one row of logits into a token under a request's SamplingParams (temperature, then min-p and
// top-k, then top-p, as vLLM applies them: the sample_rows op), plus the logprobs the request asked for. Each
// request owns its random state (seeded when `seed` is set), so results do not depend on what else is batched
// with it. A request with a grammar has its refused tokens masked out before sampling and its matcher advanced
// past each sampled token.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "engine/sampling_params.h"
#include "structured/grammar_matcher.h"

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

  // logits [vocab] (modified: scratch use). Precondition: params validated. Logprobs are of the model's
  // distribution before any grammar mask.
  SampleResult sample(std::span<float> logits);
  // The settings and the next uniform draw of one random (non-greedy) sample, for sample_rows on the device:
  // it advances the random state exactly as sample() does.
  RowSampling row_sampling();

  // Constrained decoding on the device: whether the request has a grammar, the tokens it allows next (as
  // GrammarMatcher::write_next_tokens writes them), and moving past the token sampled under that mask, as
  // sample() does after its own.
  bool constrained() const { return matcher_.has_value(); }
  void write_next_tokens(std::span<uint64_t> words) { matcher_->write_next_tokens(words); }
  void accept(int32_t token_id) { matcher_->accept(token_id); }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;  // scratch: ids ranked for the top-N logprobs
  std::optional<GrammarMatcher> matcher_;
};

}  // namespace se
