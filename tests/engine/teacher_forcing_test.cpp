// TeacherForcedSequence on the tiny model: under `vanilla`, feeding back its own argmax reproduces the greedy
// tokens of the reference path (SequenceGenerator) for any prefill chunking and page size, on a full-attention
// and a sliding-window architecture; misuse comes back as errors.
#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "../support/tiny_model.h"
#include "engine/sequence_generator.h"
#include "engine/teacher_forcing.h"

namespace se {
namespace {

int32_t argmax(const Tensor& logits) {
  const float* p = logits.data<float>();
  return static_cast<int32_t>(std::max_element(p, p + logits.numel()) - p);
}

std::vector<int32_t> random_prompt(int len, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 96);
  return p;
}

class TeacherForcingTest : public testing::TestWithParam<const char*> {};

TEST_P(TeacherForcingTest, VanillaGreedyMatchesTheReferencePath) {
  const Model model = test::tiny_model(GetParam());
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 10;
  greedy.ignore_eos = true;
  for (const auto& [prompt_len, chunk, page_size] : {std::tuple{37, 7, 4}, {20, 2048, 16}, {50, 16, 3}}) {
    const std::vector<int32_t> prompt = random_prompt(prompt_len, static_cast<uint64_t>(prompt_len));
    auto want = SequenceGenerator(model, nullptr).generate(prompt, greedy);
    ASSERT_TRUE(want.is_ok()) << want.status().to_string();

    TeacherForcingOptions options;
    options.page_size = page_size;
    options.prefill_chunk = chunk;
    options.max_tokens = prompt_len + greedy.max_tokens;
    auto run = TeacherForcedSequence::create(model, options);
    ASSERT_TRUE(run.is_ok()) << run.status().to_string();
    auto logits = (*run)->prefill(prompt);
    ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
    std::vector<int32_t> got = {argmax(*logits)};
    while (static_cast<int>(got.size()) < greedy.max_tokens) {
      logits = (*run)->decode(got.back());
      ASSERT_TRUE(logits.is_ok()) << logits.status().to_string();
      got.push_back(argmax(*logits));
    }
    EXPECT_EQ(got, want->output_ids) << "prompt " << prompt_len << ", chunk " << chunk << ", page " << page_size;
    EXPECT_EQ((*run)->num_tokens(), prompt_len + greedy.max_tokens - 1);
    EXPECT_EQ((*run)->num_held_pages(), (*run)->num_dense_pages());  // vanilla keeps every token
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, TeacherForcingTest, testing::Values("llama", "gemma3_text"));

TEST(TeacherForcingErrors, MisuseIsReported) {
  const Model model = test::tiny_model();
  TeacherForcingOptions options;
  options.max_tokens = 16;
  auto run = TeacherForcedSequence::create(model, options);
  ASSERT_TRUE(run.is_ok());
  EXPECT_EQ((*run)->decode(1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*run)->prefill({}).status().code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> prompt = {1, 2, 3};
  ASSERT_TRUE((*run)->prefill(prompt).is_ok());
  EXPECT_EQ((*run)->prefill(prompt).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*run)->decode(96).status().code(), StatusCode::kInvalidArgument);  // outside the vocabulary
  EXPECT_TRUE((*run)->decode(5).is_ok());

  options.method = "no_such_method";
  EXPECT_EQ(TeacherForcedSequence::create(model, options).status().code(), StatusCode::kInvalidArgument);
  options.method = "vanilla";
  options.config = {{"no_such_key", 1}};
  EXPECT_EQ(TeacherForcedSequence::create(model, options).status().code(), StatusCode::kInvalidArgument);
  options.config = nullptr;
  options.max_tokens = 0;
  EXPECT_EQ(TeacherForcedSequence::create(model, options).status().code(), StatusCode::kInvalidArgument);
}

// A step the pool has no room for counts nothing: the prompt's last chunk is not taken for prefilled, and a decode
// token is not taken for fed.
TEST(TeacherForcingErrors, AStepWithoutRoomCountsNothing) {
  const Model model = test::tiny_model();
  TeacherForcingOptions options;
  options.max_tokens = 16;
  options.prefill_chunk = 4;
  // How many prompt tokens the pool takes, four at a time.
  int32_t fits = 0;
  {
    auto probe = TeacherForcedSequence::create(model, options);
    ASSERT_TRUE(probe.is_ok());
    ASSERT_TRUE((*probe)->start_prefill(random_prompt(4096, 1)).is_ok());
    while ((*probe)->prefill_chunk().is_ok()) fits += options.prefill_chunk;
  }
  ASSERT_GE(fits, options.max_tokens);

  auto run = TeacherForcedSequence::create(model, options);
  ASSERT_TRUE(run.is_ok());
  ASSERT_TRUE((*run)->start_prefill(random_prompt(fits + options.prefill_chunk, 2)).is_ok());
  for (int32_t done = 0; done < fits; done += options.prefill_chunk) ASSERT_TRUE((*run)->prefill_chunk().is_ok());
  EXPECT_EQ((*run)->prefill_chunk().status().code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE((*run)->prefill_done());
  EXPECT_EQ((*run)->decode(5).status().code(), StatusCode::kFailedPrecondition);

  auto decoding = TeacherForcedSequence::create(model, options);
  ASSERT_TRUE(decoding.is_ok());
  ASSERT_TRUE((*decoding)->prefill(random_prompt(fits, 3)).is_ok());
  Result<Tensor> step = (*decoding)->decode(5);
  while (step.is_ok()) step = (*decoding)->decode(5);
  const int32_t fed = (*decoding)->num_tokens();
  EXPECT_EQ(step.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*decoding)->decode(5).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*decoding)->num_tokens(), fed);
}

}  // namespace
}  // namespace se
