#include <gtest/gtest.h>

#include "loader/gguf_builder.h"
#include "loader/gguf_file.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace se {
namespace {

using testing::GgufBuilder;
using Ids = std::vector<int32_t>;

constexpr const char* kMarker = "\u2581";

Result<Tokenizer> from_builder(const GgufBuilder& builder, const std::string& name) {
  const std::string path = testing::scratch_path(name);
  builder.write(path);
  SE_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(path));
  return Tokenizer::from_gguf(gguf);
}

// Byte-level vocabulary: bytes 0..255, 256 "Ġt", 257 "he", 258 "<|im_end|>" (control),
// 259 "<think>" (user-defined), 260 "<|im_start|>" (control).
GgufBuilder byte_level_gguf() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(testing::byte_char(static_cast<uint8_t>(b)));
  const std::string g = testing::byte_char(' ');
  tokens.insert(tokens.end(), {g + "t", "he", "<|im_end|>", "<think>", "<|im_start|>"});
  std::vector<int32_t> types(tokens.size(), 1);
  types[258] = 3;
  types[259] = 4;
  types[260] = 3;
  GgufBuilder b;
  b.add_string("general.architecture", "llama")
      .add_string("tokenizer.ggml.model", "gpt2")
      .add_string("tokenizer.ggml.pre", "smollm")
      .add_string_array("tokenizer.ggml.tokens", tokens)
      .add_array("tokenizer.ggml.token_type", GgufValueType::kI32, types)
      .add_string_array("tokenizer.ggml.merges", {g + " t", "h e"})
      .add_u32("tokenizer.ggml.bos_token_id", 260)
      .add_u32("tokenizer.ggml.eos_token_id", 258)
      .add_string("tokenizer.chat_template", "{{ messages }}");
  return b;
}

// SentencePiece-style vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3..258 bytes, then pieces with scores.
GgufBuilder sentencepiece_gguf(const std::string& arch, std::vector<std::string> pieces,
                               std::vector<float> piece_scores) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    scores.push_back(0);
    types.push_back(6);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    tokens.push_back(pieces[i]);
    scores.push_back(piece_scores[i]);
    types.push_back(pieces[i].find(' ') != std::string::npos ? 4 : 1);
  }
  GgufBuilder b;
  b.add_string("general.architecture", arch)
      .add_string("tokenizer.ggml.model", "llama")
      .add_string_array("tokenizer.ggml.tokens", tokens)
      .add_array("tokenizer.ggml.scores", GgufValueType::kF32, scores)
      .add_array("tokenizer.ggml.token_type", GgufValueType::kI32, types)
      .add_u32("tokenizer.ggml.bos_token_id", 1)
      .add_u32("tokenizer.ggml.eos_token_id", 2);
  return b;
}

TEST(GgufVocabTest, ByteLevelVocabulary) {
  Result<Tokenizer> tok = from_builder(byte_level_gguf(), "bl.gguf");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  // smollm splits every digit on its own before the GPT-2 split.
  EXPECT_EQ(tok->encode(" the 12", false, true), (Ids{256, 257, ' ', '1', '2'}));
  EXPECT_EQ(tok->encode("<|im_start|>x<think>", true, true), (Ids{260, 'x', 259}));
  EXPECT_FALSE(tok->add_bos());  // byte-level vocabularies default to no BOS
  EXPECT_EQ(tok->bos_token(), "<|im_start|>");
  EXPECT_EQ(tok->eos_token(), "<|im_end|>");
  EXPECT_EQ(tok->eog_ids(), (Ids{258}));
  EXPECT_TRUE(tok->is_special(258));
  EXPECT_FALSE(tok->is_special(259));
  EXPECT_EQ(tok->chat_template(), "{{ messages }}");
  EXPECT_EQ(*tok->decode(Ids{260, 256, 257, 259}, true), " the<think>");
}

// "abc" is a token no merge leads to: only Llama 3's pre-tokenizer (ignore_merges) yields it.
TEST(GgufVocabTest, Llama3PreTokenizerIgnoresMergesForWholeTokens) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(testing::byte_char(static_cast<uint8_t>(b)));
  tokens.insert(tokens.end(), {"ab", "abc", "12"});
  auto build = [&](const std::string& pre) {
    GgufBuilder b;
    b.add_string("tokenizer.ggml.model", "gpt2")
        .add_string("tokenizer.ggml.pre", pre)
        .add_string_array("tokenizer.ggml.tokens", tokens)
        .add_string_array("tokenizer.ggml.merges", {"a b", "1 2"});
    return from_builder(b, pre + ".gguf");
  };
  Result<Tokenizer> llama3 = build("llama-bpe");
  Result<Tokenizer> qwen2 = build("qwen2");
  ASSERT_TRUE(llama3.is_ok()) << llama3.status().to_string();
  ASSERT_TRUE(qwen2.is_ok()) << qwen2.status().to_string();
  EXPECT_EQ(llama3->encode("abc", false, true), (Ids{257}));
  EXPECT_EQ(qwen2->encode("abc", false, true), (Ids{256, 'c'}));
  // Llama 3 groups up to three digits ("12" can merge), Qwen2 splits every digit.
  EXPECT_EQ(llama3->encode("1234", false, true), (Ids{258, '3', '4'}));
  EXPECT_EQ(qwen2->encode("1234", false, true), (Ids{'1', '2', '3', '4'}));
}

TEST(GgufVocabTest, SentencePieceVocabularyMergesByScore) {
  // Ids from 259: ▁ a b ▁a ab ▁ab. "ab" scores above "▁a", so "▁ab" forms from ▁ + ab.
  const std::string m = kMarker;
  Result<Tokenizer> tok = from_builder(
      sentencepiece_gguf("llama", {m, "a", "b", m + "a", "ab", m + "ab"}, {-1, -2, -3, -6, -4, -5}),
      "spm.gguf");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  // add_space_prefix and add_bos_token default to true for SentencePiece vocabularies.
  EXPECT_EQ(tok->encode("ab", true, true), (Ids{1, 264}));
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->encode("ab ab", true, true), (Ids{1, 264, 264}));
  EXPECT_EQ(*tok->decode(Ids{1, 264, 264}, true), "ab ab");  // the added prefix space is dropped
  // A character with no piece falls back to its bytes: U+00E9 is C3 A9.
  EXPECT_EQ(tok->encode("\u00E9", false, true), (Ids{259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(*tok->decode(Ids{259, 3 + 0xC3, 3 + 0xA9}, false), "\u00E9");
}

TEST(GgufVocabTest, GemmaMergesInTokenOrderAndRespellsSpaces) {
  // Scores say "ab" (-4) before "▁a" (-5); Gemma merges in token order: "▁a" (262) first.
  // "  " (263) is stored with real spaces and means "▁▁".
  const std::string m = kMarker;
  GgufBuilder builder =
      sentencepiece_gguf("gemma3", {m, "a", "b", m + "a", "ab", "  "}, {-1, -2, -3, -5, -4, -6});
  builder.add_bool("tokenizer.ggml.add_space_prefix", false)
      .add_bool("tokenizer.ggml.add_bos_token", true);
  Result<Tokenizer> tok = from_builder(builder, "gemma.gguf");
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->encode(" ab", false, true), (Ids{262, 261}));
  EXPECT_EQ(tok->encode("a  b", false, true), (Ids{260, 264, 261}));
  EXPECT_EQ(tok->token_text(264), m + m);
  EXPECT_EQ(*tok->decode(Ids{262, 261, 264}, false), " ab  ");
  EXPECT_EQ(tok->encode("a", true, true), (Ids{1, 260}));
}

Status gguf_error(const GgufBuilder& builder, const std::string& name) {
  Result<Tokenizer> tok = from_builder(builder, name);
  EXPECT_FALSE(tok.is_ok());
  if (tok.is_ok()) return Status::ok();
  EXPECT_NE(tok.status().message().find(name), std::string::npos) << tok.status().to_string();
  return tok.status();
}

TEST(GgufVocabTest, BadMetadataGivesStatusesNamingFileAndKey) {
  GgufBuilder no_tokens;
  no_tokens.add_string("tokenizer.ggml.model", "gpt2");
  Status s = gguf_error(no_tokens, "no_tokens.gguf");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tokenizer.ggml.tokens"), std::string::npos);

  GgufBuilder wrong_type;
  wrong_type.add_string("tokenizer.ggml.model", "gpt2").add_u32("tokenizer.ggml.tokens", 3);
  EXPECT_EQ(gguf_error(wrong_type, "wrong_type.gguf").code(), StatusCode::kInvalidArgument);

  GgufBuilder unknown_model;
  unknown_model.add_string("tokenizer.ggml.model", "bert")
      .add_string_array("tokenizer.ggml.tokens", {"a"});
  EXPECT_EQ(gguf_error(unknown_model, "bert.gguf").code(), StatusCode::kUnimplemented);

  GgufBuilder unknown_pre;
  unknown_pre.add_string("tokenizer.ggml.model", "gpt2")
      .add_string("tokenizer.ggml.pre", "mystery")
      .add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"})
      .add_string_array("tokenizer.ggml.merges", {"a b"});
  s = gguf_error(unknown_pre, "mystery.gguf");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("mystery"), std::string::npos);

  GgufBuilder no_merges;
  no_merges.add_string("tokenizer.ggml.model", "gpt2")
      .add_string_array("tokenizer.ggml.tokens", {"a"});
  EXPECT_NE(gguf_error(no_merges, "no_merges.gguf").message().find("tokenizer.ggml.merges"),
            std::string::npos);

  GgufBuilder bad_merge;
  bad_merge.add_string("tokenizer.ggml.model", "gpt2")
      .add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"})
      .add_string_array("tokenizer.ggml.merges", {"a b", "a c"});
  EXPECT_NE(gguf_error(bad_merge, "bad_merge.gguf").message().find("'c'"), std::string::npos);

  GgufBuilder bad_bos;
  bad_bos.add_string("tokenizer.ggml.model", "gpt2")
      .add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab"})
      .add_string_array("tokenizer.ggml.merges", {"a b"})
      .add_u32("tokenizer.ggml.bos_token_id", 3);
  EXPECT_NE(gguf_error(bad_bos, "bad_bos.gguf").message().find("bos_token_id"), std::string::npos);

  // SentencePiece vocabularies add BOS by default, so they need one.
  GgufBuilder no_bos;
  no_bos.add_string("tokenizer.ggml.model", "llama")
      .add_string_array("tokenizer.ggml.tokens", {"<unk>", "a"})
      .add_array("tokenizer.ggml.scores", GgufValueType::kF32, std::vector<float>{0, -1});
  EXPECT_NE(gguf_error(no_bos, "no_bos.gguf").message().find("bos_token_id"), std::string::npos);
}

}  // namespace
}  // namespace se
