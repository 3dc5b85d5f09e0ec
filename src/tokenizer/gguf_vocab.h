// Reads a tokenizer description from GGUF metadata (tokenizer.ggml.*): byte-level BPE ("gpt2")
// with merges and a pre-tokenizer named by tokenizer.ggml.pre, or SentencePiece-style ("llama")
// tokens with scores and byte-fallback tokens, encoded as HF does for that vocabulary.
#pragma once

#include "base/status.h"
#include "tokenizer/tokenizer_spec.h"

namespace se {

class GgufFile;

// Errors name the file and the key; kUnimplemented for unknown tokenizer models and pre names.
Result<TokenizerSpec> tokenizer_spec_from_gguf(const GgufFile& gguf);

// How a byte-level GGUF vocabulary's tokenizer.ggml.pre name pre-tokenizes: split regexes applied
// in order (each piece split again by the next), and whether a piece that is itself a token skips
// the merges (Llama 3's tokenizer.json sets ignore_merges; llama.cpp does the same).
struct GgufPreTokenizer {
  std::vector<std::string> regexes;
  bool ignore_merges = false;
};

// kUnimplemented for names not known here.
Result<GgufPreTokenizer> gguf_pre_tokenizer(std::string_view pre);

}  // namespace se
