#include "tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

namespace se {
namespace {

using Behavior = PreTokenizer::Behavior;

std::vector<std::string> split_with(PreTokenizer::Split step, std::string_view text) {
  PreTokenizer pre;
  EXPECT_TRUE(pre.add(std::move(step)).is_ok());
  std::vector<std::string> pieces;
  pre.split(text, pieces);
  return pieces;
}

PreTokenizer::Split dash(Behavior behavior) {
  PreTokenizer::Split split;
  split.literal = "-";
  split.behavior = behavior;
  return split;
}

// The example of HF tokenizers' SplitDelimiterBehavior documentation.
TEST(PreTokenizerTest, DelimiterBehaviorsMatchHfDocumentation) {
  const std::string text = "the-final--countdown";
  using V = std::vector<std::string>;
  EXPECT_EQ(split_with(dash(Behavior::kRemoved), text), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split_with(dash(Behavior::kIsolated), text),
            (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split_with(dash(Behavior::kMergedWithPrevious), text),
            (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split_with(dash(Behavior::kMergedWithNext), text),
            (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split_with(dash(Behavior::kContiguous), text),
            (V{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizerTest, DigitsAndInvert) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_with(PreTokenizer::digits(true), "ab123c"), (V{"ab", "1", "2", "3", "c"}));
  EXPECT_EQ(split_with(PreTokenizer::digits(false), "ab123c"), (V{"ab", "123", "c"}));
  Result<PreTokenizer::Split> words = PreTokenizer::regex_split(R"(\w+)", Behavior::kRemoved, true);
  ASSERT_TRUE(words.is_ok());
  EXPECT_EQ(split_with(std::move(words).value(), "hi, you"), (V{"hi", "you"}));
}

TEST(PreTokenizerTest, ByteLevelMapsBytesAndMustComeLast) {
  PreTokenizer pre;
  ASSERT_TRUE(pre.add(PreTokenizer::ByteLevel{true, true}).is_ok());
  EXPECT_TRUE(pre.is_byte_level());
  std::vector<std::string> pieces;
  pre.split("h\u00E9 yo", pieces);
  // add_prefix_space, then GPT-2 split; space -> U+0120, 0xC3 -> U+00C3, 0xA9 -> U+00A9.
  EXPECT_EQ(pieces, (std::vector<std::string>{"\u0120h\u00C3\u00A9", "\u0120yo"}));
  EXPECT_FALSE(pre.add(PreTokenizer::digits(true)).is_ok());
}

}  // namespace
}  // namespace se
