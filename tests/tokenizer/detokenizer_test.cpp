#include "tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "test_files.h"
#include "tokenizer/utf8.h"

namespace se {
namespace {

using Ids = std::vector<int32_t>;

Tokenizer load(const nlohmann::json& j, const std::string& name) {
  Result<Tokenizer> tok = Tokenizer::from_hf_files(testing::write_file(name, j.dump()), "");
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return std::move(tok).value();
}

// Streams ids one by one; checks every piece is whole UTF-8 and the pieces add up to decode().
void expect_stream_matches_decode(const Tokenizer& tok, const Ids& ids, bool skip_special) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    Result<std::string> piece = detok.push(id);
    ASSERT_TRUE(piece.is_ok());
    EXPECT_TRUE(utf8::is_valid(*piece));
    streamed += *piece;
    EXPECT_LT(detok.num_pending_bytes(), 4u);
  }
  const std::string tail = detok.flush();
  EXPECT_TRUE(utf8::is_valid(tail));
  streamed += tail;
  EXPECT_EQ(streamed, *tok.decode(ids, skip_special));
}

TEST(DetokenizerTest, HoldsBackSplitCharacters) {
  const Tokenizer tok = load(testing::byte_fallback_tokenizer_json(false), "detok_bf.json");
  IncrementalDetokenizer detok(tok, false);
  // U+1F600 as four byte-fallback tokens (<0xXX> has id XX + 1).
  const Ids emoji = {0xF0 + 1, 0x9F + 1, 0x98 + 1, 0x80 + 1};
  for (size_t i = 0; i < emoji.size(); ++i) {
    Result<std::string> piece = detok.push(emoji[i]);
    ASSERT_TRUE(piece.is_ok());
    EXPECT_EQ(*piece, i + 1 < emoji.size() ? "" : "\U0001F600");
  }
  EXPECT_EQ(*detok.push(259), " a");
  // An incomplete sequence left at the end becomes U+FFFD on flush.
  EXPECT_EQ(*detok.push(0xE4 + 1), "");
  EXPECT_EQ(detok.flush(), "\uFFFD");
  // A broken sequence is not held: the bad byte is emitted as U+FFFD at once.
  EXPECT_EQ(*detok.push(0xE4 + 1), "");
  EXPECT_EQ(*detok.push(258), "\uFFFDa");
}

TEST(DetokenizerTest, RejectsInvalidIdsWithoutChangingState) {
  const Tokenizer tok = load(testing::byte_fallback_tokenizer_json(false), "detok_bad.json");
  IncrementalDetokenizer detok(tok, false);
  EXPECT_EQ(*detok.push(0xC3 + 1), "");
  Result<std::string> bad = detok.push(10000);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*detok.push(0xA9 + 1), "\u00E9");
}

TEST(DetokenizerTest, StripsTheLeadingSpaceLikeDecode) {
  const Tokenizer tok = load(testing::byte_fallback_tokenizer_json(true), "detok_strip.json");
  IncrementalDetokenizer detok(tok, false);
  EXPECT_EQ(*detok.push(259), "a");   // "▁a" starts the text: its space goes
  EXPECT_EQ(*detok.push(259), " a");  // later ones keep theirs
  expect_stream_matches_decode(tok, {257, 257, 259}, false);
}

TEST(DetokenizerTest, RandomSequencesMatchDecode) {
  std::mt19937 rng(1234);
  for (bool strip : {false, true}) {
    const Tokenizer tok = load(testing::byte_fallback_tokenizer_json(strip),
                               strip ? "detok_rand_strip.json" : "detok_rand.json");
    std::uniform_int_distribution<int32_t> any_id(0, tok.vocab_size() - 1);
    std::uniform_int_distribution<int> length(0, 24);
    for (int trial = 0; trial < 400; ++trial) {
      Ids ids(length(rng));
      for (int32_t& id : ids) id = any_id(rng);
      expect_stream_matches_decode(tok, ids, false);
    }
  }
  const Tokenizer byte_level = load(testing::byte_level_tokenizer_json(), "detok_rand_bl.json");
  std::uniform_int_distribution<int32_t> any_id(0, byte_level.vocab_size() - 1);
  for (int trial = 0; trial < 400; ++trial) {
    Ids ids(trial % 20);
    for (int32_t& id : ids) id = any_id(rng);
    expect_stream_matches_decode(byte_level, ids, trial % 2 == 0);
  }
}

}  // namespace
}  // namespace se
