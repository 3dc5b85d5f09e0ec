// Tokenizer: text <-> token ids for one model, built from a GGUF file's vocabulary (byte-level BPE
// "gpt2" or SentencePiece-style "llama") or from HF tokenizer.json (+ tokenizer_config.json).
// encode(): added and special tokens are cut out of the raw text first (leftmost-longest), the rest
// is normalized, pre-tokenized (PCRE2) and BPE-encoded, as HF tokenizers does. decode(): ids back
// to bytes, invalid UTF-8 repaired with U+FFFD.
// Immutable after construction (the internal BPE cache is synchronized): one Tokenizer may serve
// many threads. Copies are cheap and share the same state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace se {

class GgufFile;
struct TokenizerSpec;
struct TokenizerState;

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* metadata. Errors name the file and the key that is missing or wrong;
  // kUnimplemented for tokenizer models or pre-tokenizers this build does not know.
  static Result<Tokenizer> from_gguf(const GgufFile& gguf);
  // tokenizer_config_json_path may be empty. Errors name the file and the field.
  static Result<Tokenizer> from_hf_files(const std::string& tokenizer_json_path,
                                         const std::string& tokenizer_config_json_path);
  // add_special: add the tokens the model asks for around a sequence (BOS when add_bos(), EOS when
  // add_eos()). parse_special: match special tokens written in text; false treats them as plain
  // text (non-special added tokens, e.g. Gemma's "<b>", still match, as in llama.cpp and HF).
  // Invalid UTF-8 in text is encoded as U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // kOutOfRange naming the first id outside the vocabulary. skip_special drops special tokens.
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special) const;

  // One past the largest token id.
  int32_t vocab_size() const;
  bool is_valid_id(int32_t id) const;
  // The token as the vocabulary spells it (byte-level characters, U+2581 for spaces); empty for
  // an invalid id.
  std::string_view token_text(int32_t id) const;
  // The bytes one token decodes to: possibly part of a UTF-8 sequence; empty for an invalid id.
  std::string_view token_bytes(int32_t id) const;
  // The id of an added token's content or a vocabulary spelling.
  std::optional<int32_t> token_id(std::string_view text) const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // The BOS / EOS token text ("" when the model has none), e.g. for chat templates.
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  bool add_bos() const;
  bool add_eos() const;
  // Tokens that end generation: EOS plus end-of-turn tokens the vocabulary has (<|im_end|>,
  // <|eot_id|>, <end_of_turn>, <|endoftext|>, ...), as llama.cpp's EOG set. Sorted.
  const std::vector<int32_t>& eog_ids() const;
  bool is_eog(int32_t id) const;
  // Control tokens: special added tokens (HF) or CONTROL-type tokens (GGUF).
  bool is_special(int32_t id) const;
  // decode() drops up to this many spaces from the start of the text (SentencePiece models that
  // add a space prefix); IncrementalDetokenizer does the same.
  int leading_spaces_to_strip() const;
  // The chat template stored with the tokenizer (GGUF tokenizer.chat_template or
  // tokenizer_config.json "chat_template"); empty when none.
  const std::string& chat_template() const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerState> state) : state_(std::move(state)) {}
  // Builds from a loader's description; errors name spec.source.
  static Result<Tokenizer> from_spec(TokenizerSpec spec);

  std::shared_ptr<const TokenizerState> state_;
};

}  // namespace se
