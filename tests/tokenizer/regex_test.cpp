#include "tokenizer/regex.h"

#include <gtest/gtest.h>

#include "tokenizer/pretokenizer.h"

namespace se {
namespace {

std::vector<std::string> matches(const Regex& regex, std::string_view text) {
  std::vector<Regex::Span> spans;
  regex.find_all(text, spans);
  std::vector<std::string> out;
  for (const auto& [b, e] : spans) out.emplace_back(text.substr(b, e - b));
  return out;
}

TEST(RegexTest, Gpt2PatternSplitsLikeGpt2) {
  Result<Regex> regex = Regex::compile(kGpt2SplitPattern);
  ASSERT_TRUE(regex.is_ok()) << regex.status().to_string();
  EXPECT_EQ(matches(*regex, "Hello world's 123  foo\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " 123", " ", " foo", "\n"}));
}

TEST(RegexTest, WhitespaceMeansUnicodeWhiteSpace) {
  Result<Regex> regex = Regex::compile(R"(\s+)");
  ASSERT_TRUE(regex.is_ok());
  // U+180E is not White_Space (PCRE2's own \s would take it); U+3000 and U+0085 are.
  EXPECT_EQ(matches(*regex, "a\u180Eb\u3000c\u0085d"),
            (std::vector<std::string>{"\u3000", "\u0085"}));
  Result<Regex> in_class = Regex::compile(R"([^\s\p{L}]+)");
  ASSERT_TRUE(in_class.is_ok());
  EXPECT_EQ(matches(*in_class, "ab\u180E!\u3000?"), (std::vector<std::string>{"\u180E!", "?"}));
  Result<Regex> negated = Regex::compile(R"(\S+)");
  ASSERT_TRUE(negated.is_ok());
  EXPECT_EQ(matches(*negated, "x\u180Ey z"), (std::vector<std::string>{"x\u180Ey", "z"}));
}

TEST(RegexTest, LongRunsDoNotHitMatchLimits) {
  Result<Regex> regex = Regex::compile(kGpt2SplitPattern);
  ASSERT_TRUE(regex.is_ok());
  const std::string text = std::string(1 << 20, ' ') + "a";
  EXPECT_EQ(matches(*regex, text),
            (std::vector<std::string>{std::string((1 << 20) - 1, ' '), " a"}));
}

TEST(RegexTest, BadPatternNamesItself) {
  Result<Regex> regex = Regex::compile("(unclosed");
  ASSERT_FALSE(regex.is_ok());
  EXPECT_EQ(regex.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(regex.status().message().find("(unclosed"), std::string::npos);
}

}  // namespace
}  // namespace se
