#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace se {
namespace {

std::string lossy(std::string_view bytes) {
  std::string out;
  EXPECT_EQ(utf8::append_lossy(bytes, /*final=*/true, out), bytes.size());
  return out;
}

TEST(Utf8Test, AppendAndNextRoundTrip) {
  for (char32_t cp : {U'A', U'\u00E9', U'\u4E2D', U'\U0001F600', U'\U0010FFFF'}) {
    std::string s;
    append_utf8(s, cp);
    size_t pos = 0;
    EXPECT_EQ(utf8::next(s, pos), cp);
    EXPECT_EQ(pos, s.size());
    size_t start = 99;
    EXPECT_EQ(utf8::last("x" + s, start), cp);
    EXPECT_EQ(start, 1u);
  }
}

// The Unicode Standard (chapter 3, "U+FFFD Substitution of Maximal Subparts") example.
TEST(Utf8Test, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd");
  EXPECT_EQ(lossy("\xC0\xAF"), "\uFFFD\uFFFD");                      // overlong
  EXPECT_EQ(lossy("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");            // surrogate
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // past U+10FFFF
  EXPECT_EQ(lossy("ok \xE4\xB8\xAD"), "ok \u4E2D");
  EXPECT_EQ(lossy("\xE4\xB8"), "\uFFFD");  // truncated at the end
}

TEST(Utf8Test, StreamingHoldsBackAnIncompleteTail) {
  std::string out;
  EXPECT_EQ(utf8::append_lossy("a\xE4\xB8", /*final=*/false, out), 1u);
  EXPECT_EQ(out, "a");
  out.clear();
  EXPECT_EQ(utf8::append_lossy("\xE4\xB8\xAD", /*final=*/false, out), 3u);
  EXPECT_EQ(out, "\u4E2D");
  // An invalid continuation is not waited for.
  out.clear();
  EXPECT_EQ(utf8::append_lossy("\xE4\x41", /*final=*/false, out), 2u);
  EXPECT_EQ(out, "\uFFFDA");
}

TEST(Utf8Test, ValidityAndSanitize) {
  EXPECT_TRUE(utf8::is_valid("plain \u00E9\u4E2D\U0001F600"));
  EXPECT_FALSE(utf8::is_valid("\xFF"));
  EXPECT_FALSE(utf8::is_valid("\xE4\xB8"));
  EXPECT_EQ(utf8::sanitize("a\xFF"), "a\uFFFD");
}

TEST(Utf8Test, UnicodeClasses) {
  EXPECT_TRUE(utf8::is_whitespace(U'\u3000'));
  EXPECT_TRUE(utf8::is_whitespace(U'\u0085'));
  EXPECT_FALSE(utf8::is_whitespace(U'\u180E'));  // not White_Space since Unicode 6.3
  EXPECT_FALSE(utf8::is_whitespace(U'\u200B'));
  EXPECT_TRUE(utf8::is_word_char(U'_'));
  EXPECT_TRUE(utf8::is_word_char(U'\u0301'));
  EXPECT_TRUE(utf8::is_word_char(U'\u4E2D'));
  EXPECT_FALSE(utf8::is_word_char(U'-'));
  EXPECT_FALSE(utf8::is_word_char(U'\U0001F600'));
}

}  // namespace
}  // namespace se
