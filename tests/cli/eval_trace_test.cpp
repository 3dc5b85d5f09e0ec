// The generators of `eval --trace-lengths` and `--recall-lengths`, over a word-level test encoder. Key-value
// tracking: the trace has the requested length within one line, the asked key is set exactly once, at the asked
// depth, to the answer; the question names it; the same seed gives the same sample; a trace with no room is an
// error. Recall: the code line sits whole at its depth in the filler, the cue repeats its first two words, and the
// answer is the other four.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <span>

#include "cli/eval_trace.h"

namespace se::cli {
namespace {

// One id per whitespace-separated word (a newline is a word of its own), kept in a shared dictionary.
class WordCodec {
 public:
  std::vector<int32_t> encode(std::string_view text) {
    std::vector<int32_t> ids;
    std::string word;
    auto flush = [&] {
      if (word.empty()) return;
      auto [it, added] = ids_.try_emplace(word, static_cast<int32_t>(words_.size()));
      if (added) words_.push_back(word);
      ids.push_back(it->second);
      word.clear();
    };
    for (char c : text) {
      if (c == ' ' || c == '\n') {
        flush();
        if (c == '\n') word = "\n", flush();
      } else {
        word += c;
      }
    }
    flush();
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const {
    std::string text;
    for (int32_t id : ids) {
      const std::string& w = words_[static_cast<size_t>(id)];
      text += (w == "\n" || text.empty() || text.back() == '\n' ? "" : " ") + w;
    }
    return text;
  }

 private:
  std::map<std::string, int32_t> ids_;
  std::vector<std::string> words_;
};

class EvalTraceTest : public ::testing::Test {
 protected:
  WordCodec codec_;
  EncodeFn encode_ = [this](std::string_view text) { return codec_.encode(text); };
};

TEST_F(EvalTraceTest, TheAskedKeyIsSetOnceAtItsDepthToTheAnswer) {
  for (double depth : {0.0, 0.5, 1.0}) {
    auto sample = make_trace_sample(encode_, 7, 200, depth, 42);
    ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
    ASSERT_FALSE(sample->prompt.empty());
    EXPECT_EQ(sample->prompt.front(), 7);  // the BOS
    const std::string trace = codec_.decode(sample->trace);
    std::smatch question;
    ASSERT_TRUE(
        std::regex_search(trace, question, std::regex("what is the last value of (\\w+)\\?\nAnswer: (\\w+) =$")))
        << trace;
    const std::string asked = question[1];
    EXPECT_EQ(question[2], asked);
    // Every assignment line; the asked key's is the only one setting it.
    std::vector<std::pair<std::string, std::string>> lines;
    const std::regex line("\n(\\w+) = (\\d+)\\.");
    for (auto it = std::sregex_iterator(trace.begin(), trace.end(), line); it != std::sregex_iterator(); ++it)
      lines.emplace_back((*it)[1], (*it)[2]);
    ASSERT_GE(lines.size(), 10u);
    int64_t set = 0;
    size_t at = 0;
    for (size_t i = 0; i < lines.size(); ++i)
      if (lines[i].first == asked) set += 1, at = i;
    EXPECT_EQ(set, 1) << trace;
    EXPECT_EQ(lines[at].second, sample->answer);
    EXPECT_NEAR(static_cast<double>(at) / static_cast<double>(lines.size() - 1), depth, 0.05);
    // asked_token points at that line.
    const std::vector<int32_t> asked_line = encode_("\n" + asked + " = " + sample->answer + ".");
    EXPECT_TRUE(std::equal(asked_line.begin(), asked_line.end(), sample->trace.begin() + sample->asked_token));
  }
}

TEST_F(EvalTraceTest, TheTraceHasTheRequestedLengthWithinOneLine) {
  auto sample = make_trace_sample(encode_, std::nullopt, 300, 0.3, 1);
  ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
  const size_t question = encode_("\n\nQuestion: what is the last value of apple?\nAnswer: apple =").size();
  const size_t assignments = sample->trace.size() - question;
  EXPECT_GE(assignments, 300u);
  EXPECT_LT(assignments, 300u + 4u);  // a line is its newline and three words
}

TEST_F(EvalTraceTest, TheSameSeedGivesTheSameSample) {
  auto a = make_trace_sample(encode_, std::nullopt, 120, 0.5, 9);
  auto b = make_trace_sample(encode_, std::nullopt, 120, 0.5, 9);
  auto c = make_trace_sample(encode_, std::nullopt, 120, 0.5, 10);
  ASSERT_TRUE(a.is_ok() && b.is_ok() && c.is_ok());
  EXPECT_EQ(a->trace, b->trace);
  EXPECT_EQ(a->answer, b->answer);
  EXPECT_NE(a->trace, c->trace);
}

TEST_F(EvalTraceTest, BadArgumentsAreErrors) {
  EXPECT_EQ(make_trace_sample(encode_, std::nullopt, 3, 0.5, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make_trace_sample(encode_, std::nullopt, 100, 1.5, 1).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EvalTraceTest, RecallPlacesTheCodeLineAtItsDepthInTheFillerAndCuesItsFirstTwoWords) {
  std::vector<int32_t> prose;
  prose.reserve(100);
  for (int i = 0; i < 100; ++i) prose.push_back(encode_("w" + std::to_string(i))[0]);
  for (double depth : {0.0, 0.25, 1.0}) {
    auto sample = make_recall_sample(encode_, 7, prose, depth, 5);
    ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
    EXPECT_EQ(sample->prompt.front(), 7);  // the BOS
    const std::string trace = codec_.decode(sample->trace);
    std::smatch line, cue;
    ASSERT_TRUE(
        std::regex_search(trace, line, std::regex("\nThe code words are: (\\w+) (\\w+) (\\w+ \\w+ \\w+ \\w+)\\.\n")))
        << trace;
    ASSERT_TRUE(std::regex_search(trace, cue, std::regex("\nThe code words are: (\\w+) (\\w+)$"))) << trace;
    EXPECT_EQ(cue[1], line[1]);
    EXPECT_EQ(cue[2], line[2]);
    EXPECT_EQ(line[3], sample->answer);
    // The filler is whole and in order around the line, which starts `depth` of the way into it.
    EXPECT_EQ(sample->asked_token, static_cast<int64_t>(std::llround(depth * 100)));
    EXPECT_TRUE(std::equal(prose.begin(), prose.begin() + sample->asked_token, sample->trace.begin()));
    const std::vector<int32_t> code_line = encode_("\nThe code words are: " + std::string(line[1]) + " " +
                                                   std::string(line[2]) + " " + sample->answer + ".\n");
    EXPECT_TRUE(std::equal(code_line.begin(), code_line.end(), sample->trace.begin() + sample->asked_token));
    EXPECT_TRUE(std::equal(prose.begin() + sample->asked_token, prose.end(),
                           sample->trace.begin() + sample->asked_token + static_cast<int64_t>(code_line.size())));
  }
  // The seed picks the words.
  auto a = make_recall_sample(encode_, std::nullopt, prose, 0.5, 1);
  auto b = make_recall_sample(encode_, std::nullopt, prose, 0.5, 2);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_NE(a->answer, b->answer);
  EXPECT_EQ(make_recall_sample(encode_, std::nullopt, prose, 0.5, 1)->trace, a->trace);
  EXPECT_EQ(make_recall_sample(encode_, std::nullopt, {}, 0.5, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(make_recall_sample(encode_, std::nullopt, prose, -0.1, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace se::cli
