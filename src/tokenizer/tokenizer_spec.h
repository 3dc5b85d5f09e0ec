// TokenizerSpec: the plain description of a tokenizer that the two loaders (GGUF vocabulary,
// HF tokenizer.json) produce and Tokenizer is built from. Internal to the tokenizer module.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/vocab.h"

namespace se {

// How one token's spelling turns back into bytes (HF decoders that act token by token).
struct DecoderSpec {
  bool byte_level = false;     // GPT-2 byte alphabet
  bool byte_fallback = false;  // a spelling "<0xHH>" is the raw byte HH
  std::vector<std::pair<std::string, std::string>> replacements;  // literal, applied in order
  int strip_leading_spaces = 0;  // spaces dropped from the start of the decoded text
};

struct TokenizerSpec {
  std::string source;  // the file it came from, for messages

  std::shared_ptr<Vocab> model_vocab = std::make_shared<Vocab>();
  // Either explicit merges, or (when merge_priority is non-empty) a priority per token.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<uint32_t> merge_priority;
  BpeModel::Options bpe;

  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  // SentencePiece's add_space_prefix: U+2581 before the text when it starts the input.
  bool prepend_space_to_first = false;
  DecoderSpec decoder;

  std::vector<AddedToken> added_tokens;
  std::vector<int32_t> prefix_ids;  // added by encode(add_special), e.g. BOS
  std::vector<int32_t> suffix_ids;  // e.g. EOS
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::vector<int32_t> extra_eog_ids;  // end-of-turn ids the file names besides EOS
  std::string chat_template;
};

}  // namespace se
