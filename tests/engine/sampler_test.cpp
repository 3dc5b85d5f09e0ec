#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace se {
namespace {

std::vector<float> logits_from_probs(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<int, int> histogram(const SamplingParams& params, const std::vector<float>& logits, int draws) {
  RequestSampler sampler(params);
  std::map<int, int> counts;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> row = logits;
    ++counts[sampler.sample(row).token_id];
  }
  return counts;
}

// A grammar's mask: only the tokens it allows are sampled, greedy or not, and the logprob stays the model's.
TEST(SamplerTest, GrammarMasksRefusedTokens) {
  // Token 0 "x" is the model's favourite but never JSON; "{" then "}" then end-of-generation (3) is the only way.
  const std::vector<std::string> vocab = {"x", "{", "}", ""};
  auto trie = std::make_shared<const VocabTrie>(vocab);
  auto grammar = std::make_shared<const TokenGrammar>(TokenGrammar{JsonGrammar::any_object(), trie, {3}});
  const std::vector<float> logits = logits_from_probs({0.7, 0.1, 0.1, 0.1});
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 5;
    p.grammar = grammar;
    RequestSampler sampler(p);
    for (int32_t expected : {1, 2, 3}) {
      std::vector<float> row = logits;
      SampleResult r = sampler.sample(row);
      EXPECT_EQ(r.token_id, expected) << "temperature " << temperature;
      EXPECT_NEAR(r.logprob, std::log(0.1), 1e-5);
    }
  }
}

TEST(SamplerTest, GreedyPicksArgmaxAndReportsLogprobs) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 2;
  RequestSampler sampler(p);
  std::vector<float> logits = logits_from_probs({0.1, 0.6, 0.3});
  SampleResult r = sampler.sample(logits);
  EXPECT_EQ(r.token_id, 1);
  EXPECT_NEAR(r.logprob, std::log(0.6), 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token_id, 1);
  EXPECT_EQ(r.top[1].token_id, 2);
  EXPECT_NEAR(r.top[1].logprob, std::log(0.3), 1e-5);
}

TEST(SamplerTest, TopKTopPAndMinPRestrictTheSupport) {
  const std::vector<float> logits = logits_from_probs({0.5, 0.25, 0.15, 0.1});
  SamplingParams p;
  p.seed = 7;
  p.top_k = 2;
  auto counts = histogram(p, logits, 3000);
  EXPECT_EQ(counts.count(2) + counts.count(3), 0u);
  EXPECT_NEAR(counts[0] / 3000.0, 2.0 / 3.0, 0.04);

  p = SamplingParams{};
  p.seed = 7;
  p.top_p = 0.7f;  // 0.5 + 0.25 reaches 0.7: tokens 0 and 1
  counts = histogram(p, logits, 3000);
  EXPECT_EQ(counts.count(2) + counts.count(3), 0u);
  EXPECT_GT(counts[1], 0);

  p = SamplingParams{};
  p.seed = 7;
  p.min_p = 0.4f;  // keeps p >= 0.2: tokens 0 and 1
  counts = histogram(p, logits, 3000);
  EXPECT_EQ(counts.count(2) + counts.count(3), 0u);
}

TEST(SamplerTest, TemperatureSharpensAndSeedsReproduce) {
  const std::vector<float> logits = logits_from_probs({0.4, 0.35, 0.25});
  SamplingParams p;
  p.seed = 123;
  p.temperature = 0.05f;
  auto counts = histogram(p, logits, 500);
  EXPECT_GT(counts[0], 450);

  p.temperature = 1.0f;
  RequestSampler a(p), b(p);
  for (int i = 0; i < 50; ++i) {
    std::vector<float> ra = logits, rb = logits;
    EXPECT_EQ(a.sample(ra).token_id, b.sample(rb).token_id);
  }
}

TEST(SamplingParamsTest, RejectsImpossibleValues) {
  SamplingParams p;
  EXPECT_TRUE(p.validate().is_ok());
  p.temperature = -1.0f;
  EXPECT_FALSE(p.validate().is_ok());
  p = SamplingParams{};
  p.top_p = 0.0f;
  EXPECT_NE(p.validate().message().find("top_p"), std::string::npos);
  p = SamplingParams{};
  p.max_tokens = 0;
  EXPECT_FALSE(p.validate().is_ok());
  p = SamplingParams{};
  p.min_p = 1.5f;
  EXPECT_FALSE(p.validate().is_ok());
  p = SamplingParams{};
  p.stop = {""};
  EXPECT_FALSE(p.validate().is_ok());
}

}  // namespace
}  // namespace se
