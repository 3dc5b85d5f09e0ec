// Small tokenizer files for the tokenizer unit tests: a byte-level BPE tokenizer.json and a
// SentencePiece-style (byte-fallback) one, written to the test scratch directory.
// Test-only helpers; not thread-safe.
#pragma once

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "loader/test_models.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace se::testing {

inline std::string write_file(const std::string& name, const std::string& content) {
  const std::string path = scratch_path(name);
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

inline std::string byte_char(uint8_t b) {
  std::string s;
  append_utf8(s, byte_level::byte_to_char(b));
  return s;
}

// Byte-level BPE: ids 0..255 are the bytes, 256 "Ġt", 257 "he", 258 "Ġthe"; added tokens
// 259 "<|end|>" (special), 260 "<think>" (not special), 261 "<|begin|>" (special, prepended).
inline nlohmann::json byte_level_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<uint8_t>(b))] = b;
  const std::string g = byte_char(' ');
  vocab[g + "t"] = 256;
  vocab["he"] = 257;
  vocab[g + "the"] = 258;
  nlohmann::json j;
  j["model"] = {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", {g + " t", "h e", nlohmann::json::array({g + "t", "he"})}}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|begin|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens",
       {{"<|begin|>", {{"id", "<|begin|>"}, {"ids", {261}}, {"tokens", {"<|begin|>"}}}}}}};
  j["added_tokens"] = {
      {{"id", 259}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
      {{"id", 260}, {"content", "<think>"}, {"special", false}, {"normalized", false}},
      {{"id", 261}, {"content", "<|begin|>"}, {"special", true}, {"normalized", false}}};
  return j;
}

// SentencePiece-style BPE with byte fallback: 0 "<unk>", 1..256 "<0x00>".."<0xFF>", then
// "▁" 257, "a" 258, "▁a" 259, "b" 260, "ab" 261.
inline nlohmann::json byte_fallback_tokenizer_json(bool strip_leading_space) {
  nlohmann::json vocab = nlohmann::json::object();
  vocab["<unk>"] = 0;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = b + 1;
  vocab["\u2581"] = 257;
  vocab["a"] = 258;
  vocab["\u2581a"] = 259;
  vocab["b"] = 260;
  vocab["ab"] = 261;
  nlohmann::json j;
  j["model"] = {{"type", "BPE"},         {"vocab", vocab},       {"merges", {"\u2581 a", "a b"}},
                {"byte_fallback", true}, {"unk_token", "<unk>"}, {"fuse_unk", true}};
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  j["pre_tokenizer"] = nullptr;
  nlohmann::json decoders = {
      {{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
      {{"type", "ByteFallback"}},
      {{"type", "Fuse"}}};
  if (strip_leading_space) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  j["added_tokens"] = nlohmann::json::array();
  return j;
}

}  // namespace se::testing
