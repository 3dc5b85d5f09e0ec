// Reads a tokenizer description from HF files: tokenizer.json (model BPE; normalizer,
// pre-tokenizer, decoder, post-processor and added tokens as far as byte-level BPE and
// SentencePiece-converted BPE models use them) plus optional tokenizer_config.json (BOS/EOS
// tokens, add_bos_token / add_eos_token, chat_template).
#pragma once

#include <string>

#include "base/status.h"
#include "tokenizer/tokenizer_spec.h"

namespace se {

// config_path may be empty. Errors name the file and the field that is missing or malformed;
// kUnimplemented for components this build does not support.
Result<TokenizerSpec> tokenizer_spec_from_hf_files(const std::string& tokenizer_json_path,
                                                   const std::string& config_path);

}  // namespace se
