// IncrementalDetokenizer: turns a stream of generated token ids into text pieces for streaming.
// It holds back bytes that may still complete a UTF-8 sequence (multi-byte characters split over
// tokens, byte-fallback tokens), so no piece ends inside a character; the pieces of push() plus
// flush() always concatenate to Tokenizer::decode() of the same ids.
// One instance per sequence; not thread-safe. Keeps a copy of the Tokenizer (shared state).
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

namespace se {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special);

  // The text completed by this token (often empty while a character is incomplete).
  // kOutOfRange for an id outside the vocabulary; the state is then unchanged.
  Result<std::string> push(int32_t id);

  // Everything still held back, incomplete sequences as U+FFFD; then starts over.
  std::string flush();

  // Bytes held back, waiting for the rest of a character.
  size_t num_pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;
  int spaces_to_strip_;  // leading spaces still to drop at the start of the text
  bool at_start_ = true;
};

}  // namespace se
