// SamplingParams: per-request decoding settings (OpenAI/vLLM semantics) and their validation.
// Plain data, copied into each request.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace se {

struct TokenGrammar;

struct SamplingParams {
  int max_tokens = 16;
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  int top_k = 0;             // 0 or -1 = off
  float min_p = 0.0f;        // in [0, 1]
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;        // stop strings; the match is not part of the output
  std::vector<int32_t> stop_token_ids;  // extra stop tokens, besides the model's end-of-generation ids
  bool ignore_eos = false;
  int logprobs = -1;  // -1 = none; N >= 0 returns the sampled token's logprob and the top-N alternatives
  // Constrained decoding (structured output, required tool calls): only tokens the grammar allows are sampled,
  // on the host. Shared and immutable; null = unconstrained.
  std::shared_ptr<const TokenGrammar> grammar;

  static constexpr int kMaxLogprobs = 20;
  static constexpr int kMaxStopStrings = 16;

  // Checks every field; the message names the field and the allowed range.
  Status validate() const;
  bool greedy() const { return temperature == 0.0f; }
};

}  // namespace se
