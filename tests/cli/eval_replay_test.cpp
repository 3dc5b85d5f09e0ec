// eval's written continuations and their replay on the tiny model: vanilla replaying its own continuation (greedy or
// seeded sampling) agrees on every step with a KL of exactly 0, a sampled one repeats under its seed, a method that
// evicts departs from vanilla, and misuse comes back as errors.
#include <random>

#include <gtest/gtest.h>

#include "../support/tiny_model.h"
#include "cli/eval_replay.h"

namespace se::cli {
namespace {

constexpr int kContinuation = 48;

std::vector<int32_t> random_prompt(int len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 96);
  return p;
}

std::unique_ptr<TeacherForcedSequence> start(const Model& model, const std::string& method, nlohmann::json config) {
  TeacherForcingOptions options;
  options.method = method;
  options.config = std::move(config);
  options.page_size = 4;
  options.prefill_chunk = 8;
  options.max_tokens = 64 + kContinuation;
  auto run = TeacherForcedSequence::create(model, options);
  EXPECT_TRUE(run.is_ok()) << run.status().to_string();
  return std::move(run).value();
}

SamplingParams sampling(float temperature, uint64_t seed) {
  SamplingParams params;
  params.temperature = temperature;
  params.seed = seed;
  return params;
}

class EvalReplayTest : public ::testing::TestWithParam<float> {
 protected:
  const Model model_ = test::tiny_model();
  const std::vector<int32_t> prompt_ = random_prompt(30, 5);
};

TEST_P(EvalReplayTest, VanillaReplayingItsOwnContinuationIsExact) {
  auto writer = start(model_, "vanilla", nullptr);
  auto written = write_continuation(*writer, prompt_, kContinuation, sampling(GetParam(), 11));
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  ASSERT_EQ(written->tokens.size(), static_cast<size_t>(kContinuation));
  ASSERT_EQ(written->log_probs.size(), static_cast<size_t>(kContinuation));
  EXPECT_EQ(writer->num_tokens(), static_cast<int32_t>(prompt_.size()) + kContinuation);

  auto replayer = start(model_, "vanilla", nullptr);
  auto score = replay_against(*replayer, prompt_, written->tokens, written->log_probs);
  ASSERT_TRUE(score.is_ok()) << score.status().to_string();
  EXPECT_EQ(score->steps, kContinuation);
  EXPECT_EQ(score->agree, kContinuation);
  EXPECT_EQ(score->mean_kl, 0.0);

  // The same continuation fed as a given text has the same log-probabilities.
  auto feeder = start(model_, "vanilla", nullptr);
  auto forced = forced_log_probs(*feeder, prompt_, written->tokens);
  ASSERT_TRUE(forced.is_ok()) << forced.status().to_string();
  EXPECT_EQ(*forced, written->log_probs);
}

TEST_P(EvalReplayTest, TheSameSeedWritesTheSameContinuation) {
  auto first = write_continuation(*start(model_, "vanilla", nullptr), prompt_, kContinuation, sampling(GetParam(), 3));
  auto again = write_continuation(*start(model_, "vanilla", nullptr), prompt_, kContinuation, sampling(GetParam(), 3));
  auto other = write_continuation(*start(model_, "vanilla", nullptr), prompt_, kContinuation, sampling(GetParam(), 4));
  ASSERT_TRUE(first.is_ok() && again.is_ok() && other.is_ok());
  EXPECT_EQ(first->tokens, again->tokens);
  if (GetParam() == 0.0f) {
    EXPECT_EQ(first->tokens, other->tokens);  // greedy ignores the seed
  } else {
    EXPECT_NE(first->tokens, other->tokens);
  }
}

TEST_P(EvalReplayTest, AnEvictingMethodDepartsFromVanilla) {
  auto written =
      write_continuation(*start(model_, "vanilla", nullptr), prompt_, kContinuation, sampling(GetParam(), 2));
  ASSERT_TRUE(written.is_ok()) << written.status().to_string();
  auto run = start(model_, "streamingllm", {{"budget", 8}, {"sink_tokens", 2}});
  auto score = replay_against(*run, prompt_, written->tokens, written->log_probs);
  ASSERT_TRUE(score.is_ok()) << score.status().to_string();
  EXPECT_EQ(score->steps, kContinuation);
  EXPECT_GT(score->mean_kl, 0.0);
  EXPECT_LT(score->agree, kContinuation);
  EXPECT_LT(run->held_bytes_fraction(), 0.5);
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSampled, EvalReplayTest, ::testing::Values(0.0f, 1.0f));

TEST(EvalReplayErrors, MisuseIsReported) {
  const Model model = test::tiny_model();
  const std::vector<int32_t> prompt = random_prompt(10, 1);
  EXPECT_EQ(write_continuation(*start(model, "vanilla", nullptr), prompt, 0, sampling(0.0f, 0)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(write_continuation(*start(model, "vanilla", nullptr), prompt, 4, sampling(-1.0f, 0)).status().code(),
            StatusCode::kInvalidArgument);
  const std::vector<int32_t> continuation = {1, 2, 3};
  const StepLogProbs short_reference(2, std::vector<float>(96, 0.0f));
  EXPECT_EQ(replay_against(*start(model, "vanilla", nullptr), prompt, continuation, short_reference).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace se::cli
