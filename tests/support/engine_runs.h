// Greedy runs of an Engine over token-id prompts, for the engine tests that compare one configuration's tokens
// with another's: whole generations, and the teacher-forced next-token agreement that judges a lossy one.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "base/check.h"
#include "engine/engine.h"
#include "tiny_engine.h"

namespace se::test {

struct Generated {
  std::vector<std::vector<int32_t>> tokens;  // per request
  std::vector<int> num_cached_tokens;        // per request
  EngineStats stats;                         // once drained
};

// One request's stream drained: its tokens, their log-probabilities and the last output (finish reason, chain
// status, cached tokens).
struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  RequestOutput last;
};

inline Generation collect(OutputStream& stream) {
  Generation g;
  while (true) {
    auto out = stream.next(std::chrono::milliseconds(120000));
    SE_CHECK(out.has_value(), "stream stalled");
    for (const TokenOutput& t : out->tokens) {
      g.tokens.push_back(t.token_id);
      g.logprobs.push_back(t.logprob);
    }
    if (out->finished) {
      g.last = *out;
      return g;
    }
  }
}

// Runs the prompts one after another (so a later one may reuse an earlier one's prefix), each to max_tokens.
inline Generated generate(const ModelBundle& bundle, const EngineConfig& config,
                          const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  auto engine = Engine::create(bundle, config);
  SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
  Generated g;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto stream = (*engine)->submit({"r" + std::to_string(i), prompts[i], greedy(max_tokens)});
    SE_CHECK(stream.is_ok(), "{}", stream.status().to_string());
    Generation run = collect(**stream);
    g.num_cached_tokens.push_back(run.last.num_cached_tokens);
    g.tokens.push_back(std::move(run.tokens));
  }
  (*engine)->shutdown(/*drain=*/true);
  g.stats = (*engine)->stats();
  return g;
}

// Teacher-forced next-token agreement: for every step i of every request of `reference`, the token `config`'s
// engine picks after the prompt and the reference's first i tokens, against the reference's token i. Greedy
// continuations compound a single flip into a different text; this counts each step's decision on its own.
inline double next_token_agreement(const ModelBundle& bundle, const EngineConfig& config,
                                   const std::vector<std::vector<int32_t>>& prompts, const Generated& reference) {
  std::vector<std::vector<int32_t>> forced;
  std::vector<int32_t> want;
  for (size_t r = 0; r < prompts.size(); ++r)
    for (size_t i = 0; i < reference.tokens[r].size(); ++i) {
      std::vector<int32_t> prompt = prompts[r];
      prompt.insert(prompt.end(), reference.tokens[r].begin(), reference.tokens[r].begin() + static_cast<int64_t>(i));
      forced.push_back(std::move(prompt));
      want.push_back(reference.tokens[r][i]);
    }
  const Generated got = generate(bundle, config, forced, 1);
  size_t agree = 0;
  for (size_t k = 0; k < want.size(); ++k) agree += got.tokens[k][0] == want[k] ? 1 : 0;
  return static_cast<double>(agree) / static_cast<double>(want.size());
}

}  // namespace se::test
