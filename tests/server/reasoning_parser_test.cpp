#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace se::server {
namespace {

ReasoningDelta run(ReasoningFormat format, const std::vector<std::string>& pieces) {
  ReasoningParser parser(format);
  ReasoningDelta all;
  for (const std::string& piece : pieces) {
    ReasoningDelta d = parser.push(piece);
    all.reasoning += d.reasoning;
    all.content += d.content;
  }
  ReasoningDelta d = parser.flush();
  all.reasoning += d.reasoning;
  all.content += d.content;
  return all;
}

// Every way of cutting `text` in two, and one byte at a time, splits it as the whole text does.
void expect_split(ReasoningFormat format, const std::string& text, const std::string& reasoning,
                  const std::string& content) {
  ReasoningDelta whole = run(format, {text});
  EXPECT_EQ(whole.reasoning, reasoning) << text;
  EXPECT_EQ(whole.content, content) << text;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ReasoningDelta two = run(format, {text.substr(0, cut), text.substr(cut)});
    EXPECT_EQ(two.reasoning, reasoning) << text << " cut at " << cut;
    EXPECT_EQ(two.content, content) << text << " cut at " << cut;
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ReasoningDelta each = run(format, bytes);
  EXPECT_EQ(each.reasoning, reasoning);
  EXPECT_EQ(each.content, content);
}

TEST(ReasoningParser, Names) {
  EXPECT_EQ(reasoning_format_from_name("qwen3"), ReasoningFormat::kQwen3);
  EXPECT_EQ(reasoning_format_from_name("deepseek_r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_FALSE(reasoning_format_from_name("granite"));
}

TEST(ReasoningParser, Qwen3SplitsAnOpeningThinkBlock) {
  expect_split(ReasoningFormat::kQwen3, "<think>\nplan it</think>\n\nThe answer", "\nplan it", "\n\nThe answer");
  expect_split(ReasoningFormat::kQwen3, "<think></think>ok", "", "ok");
}

TEST(ReasoningParser, Qwen3WithoutAnOpeningTagIsContent) {
  expect_split(ReasoningFormat::kQwen3, "Plain answer with </think> and <think> in it", "",
               "Plain answer with </think> and <think> in it");
  expect_split(ReasoningFormat::kQwen3, "<thin", "", "<thin");
}

TEST(ReasoningParser, DeepSeekR1StartsInReasoning) {
  expect_split(ReasoningFormat::kDeepSeekR1, "let me see</think>42", "let me see", "42");
  expect_split(ReasoningFormat::kDeepSeekR1, "<think>let me see</think>42", "let me see", "42");
  expect_split(ReasoningFormat::kDeepSeekR1, "never closes </thin", "never closes </thin", "");
  expect_split(ReasoningFormat::kDeepSeekR1, "a</think>b</think>c", "a", "b</think>c");
}

TEST(ReasoningParser, HoldsBackOnlyWhatMayBeATag) {
  ReasoningParser parser(ReasoningFormat::kDeepSeekR1);
  ReasoningDelta d = parser.push("abc</th");
  EXPECT_EQ(d.reasoning, "abc");
  d = parser.push("x");
  EXPECT_EQ(d.reasoning, "</thx");
  d = parser.push("</think>tail");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "tail");
}

}  // namespace
}  // namespace se::server
