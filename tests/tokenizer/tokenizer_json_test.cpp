#include <gtest/gtest.h>

#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace se {
namespace {

using testing::byte_level_tokenizer_json;
using testing::write_file;
using Ids = std::vector<int32_t>;

Tokenizer load(const nlohmann::json& j, const std::string& name, const std::string& config = "") {
  const std::string path = write_file(name, j.dump());
  const std::string config_path = config.empty() ? "" : write_file(name + ".config", config);
  Result<Tokenizer> tok = Tokenizer::from_hf_files(path, config_path);
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return std::move(tok).value();
}

Status load_error(const std::string& text, const std::string& name,
                  const std::string& config = "") {
  const std::string path = write_file(name, text);
  const std::string config_path = config.empty() ? "" : write_file(name + ".config", config);
  Result<Tokenizer> tok = Tokenizer::from_hf_files(path, config_path);
  EXPECT_FALSE(tok.is_ok());
  if (tok.is_ok()) return Status::ok();
  // Every error names the file it is about.
  EXPECT_NE(tok.status().message().find(name), std::string::npos) << tok.status().to_string();
  return tok.status();
}

TEST(TokenizerJsonTest, EncodesWithMergesAndAddedTokens) {
  const Tokenizer tok = load(byte_level_tokenizer_json(), "bl.json");
  EXPECT_EQ(tok.vocab_size(), 262);
  // "the": t h e -> t he; " the": Ġt first (rank 0), then he, then Ġthe.
  EXPECT_EQ(tok.encode("the the", false, true), (Ids{'t', 257, 258}));
  EXPECT_EQ(tok.encode("the", true, true), (Ids{261, 't', 257}));
  EXPECT_EQ(tok.encode("a<|end|>b<think>", false, true), (Ids{'a', 259, 'b', 260}));
  // Plain-text mode leaves the special token as text but still matches <think>.
  const Ids plain = tok.encode("<|end|><think>", false, false);
  EXPECT_EQ(plain.back(), 260);
  EXPECT_EQ(plain.size(), 8u);
  EXPECT_EQ(tok.bos_id(), 261);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_EQ(tok.bos_token(), "<|begin|>");
  EXPECT_TRUE(tok.is_special(259));
  EXPECT_FALSE(tok.is_special(260));
  EXPECT_TRUE(tok.is_eog(259));  // "<|end|>" is an end-of-turn name
  EXPECT_EQ(tok.token_id("<think>"), 260);
  EXPECT_EQ(tok.token_id("he"), 257);
  EXPECT_EQ(tok.token_text(258), "\u0120the");
  EXPECT_EQ(tok.token_bytes(258), " the");
  EXPECT_EQ(tok.token_text(9999), "");
}

TEST(TokenizerJsonTest, DecodeRoundTripsAndChecksIds) {
  const Tokenizer tok = load(byte_level_tokenizer_json(), "bl_decode.json");
  const std::string text = "the <think>h\u00E9 \U0001F600\t\n  x<|end|>";
  const Ids ids = tok.encode(text, true, true);
  EXPECT_EQ(*tok.decode(ids, false), "<|begin|>" + text);
  EXPECT_EQ(*tok.decode(ids, true), "the <think>h\u00E9 \U0001F600\t\n  x");
  const Ids bad = {'a', 262};
  Result<std::string> decoded = tok.decode(bad, false);
  ASSERT_FALSE(decoded.is_ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(decoded.status().message().find("262"), std::string::npos);
  EXPECT_FALSE(tok.decode(Ids{-1}, false).is_ok());
  // A lone continuation byte decodes to U+FFFD rather than broken UTF-8.
  EXPECT_EQ(*tok.decode(Ids{0xA9}, false), "\uFFFD");
  // Invalid UTF-8 input is encoded as U+FFFD.
  EXPECT_EQ(tok.encode("\xFF", false, true), tok.encode("\uFFFD", false, true));
}

TEST(TokenizerJsonTest, ConfigOverridesSpecialTokens) {
  const std::string config = R"({"bos_token": {"content": "<think>"}, "eos_token": "<|end|>",
      "add_bos_token": false, "add_eos_token": true,
      "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  const Tokenizer tok = load(byte_level_tokenizer_json(), "bl_config.json", config);
  EXPECT_EQ(tok.bos_id(), 260);
  EXPECT_EQ(tok.eos_id(), 259);
  EXPECT_EQ(tok.eos_token(), "<|end|>");
  EXPECT_FALSE(tok.add_bos());
  EXPECT_TRUE(tok.add_eos());
  EXPECT_EQ(tok.encode("the", true, true), (Ids{'t', 257, 259}));
  EXPECT_EQ(tok.chat_template(), "D");
}

TEST(TokenizerJsonTest, ByteFallbackAndStrip) {
  const Tokenizer tok = load(testing::byte_fallback_tokenizer_json(true), "bf.json");
  // " ab a" -> ▁ab▁a: (▁,a) rank 0 first, then (a,b)... ▁ a b ▁ a: ▁a at 0, ▁a at 3 -> ▁a b ▁a.
  EXPECT_EQ(tok.encode(" ab a", false, true), (Ids{259, 260, 259}));
  // Characters without a token fall back to their bytes.
  EXPECT_EQ(tok.encode("\u00E9", false, true), (Ids{0xC3 + 1, 0xA9 + 1}));
  EXPECT_EQ(*tok.decode(Ids{259, 260, 259}, false), "ab a");  // leading space stripped
  EXPECT_EQ(tok.leading_spaces_to_strip(), 1);
}

TEST(TokenizerJsonTest, MalformedFilesGiveStatusesNamingTheFile) {
  EXPECT_EQ(load_error("{not json", "bad_syntax.json").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(load_error("[1, 2]", "bad_root.json").code(), StatusCode::kInvalidArgument);
  Status missing_model = load_error(R"({"decoder": {"type": "ByteLevel"}})", "no_model.json");
  EXPECT_NE(missing_model.message().find("'model' is missing"), std::string::npos);

  nlohmann::json j = byte_level_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  EXPECT_EQ(load_error(j.dump(), "wordpiece.json").code(), StatusCode::kUnimplemented);

  j = byte_level_tokenizer_json();
  j["model"]["merges"].push_back("x zzz");
  Status bad_merge = load_error(j.dump(), "bad_merge.json");
  EXPECT_NE(bad_merge.message().find("zzz"), std::string::npos);

  j = byte_level_tokenizer_json();
  j["model"]["vocab"]["x"] = "seven";
  EXPECT_NE(load_error(j.dump(), "bad_vocab.json").message().find("model.vocab"),
            std::string::npos);

  j = byte_level_tokenizer_json();
  j["model"].erase("merges");
  EXPECT_NE(load_error(j.dump(), "no_merges.json").message().find("model.merges"),
            std::string::npos);

  j = byte_level_tokenizer_json();
  j["added_tokens"][0].erase("id");
  EXPECT_NE(load_error(j.dump(), "added_no_id.json").message().find("added_tokens[0].id"),
            std::string::npos);

  j = byte_level_tokenizer_json();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_EQ(load_error(j.dump(), "bert_norm.json").code(), StatusCode::kUnimplemented);

  j = byte_level_tokenizer_json();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(oops"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(load_error(j.dump(), "bad_regex.json").message().find("(oops"), std::string::npos);

  j = byte_level_tokenizer_json();
  j["post_processor"]["special_tokens"] = nlohmann::json::object();
  EXPECT_NE(load_error(j.dump(), "bad_template.json").message().find("<|begin|>"),
            std::string::npos);

  Status bad_config = load_error(byte_level_tokenizer_json().dump(), "bad_config.json",
                                 R"({"bos_token": "<nope>"})");
  EXPECT_NE(bad_config.message().find("<nope>"), std::string::npos);
  EXPECT_NE(bad_config.message().find("bad_config.json.config"), std::string::npos);

  Result<Tokenizer> absent = Tokenizer::from_hf_files(testing::scratch_path("absent.json"), "");
  ASSERT_FALSE(absent.is_ok());
  EXPECT_EQ(absent.status().code(), StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find("absent.json"), std::string::npos);
}

}  // namespace
}  // namespace se
