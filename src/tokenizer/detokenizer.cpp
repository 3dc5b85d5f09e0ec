#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace se {

IncrementalDetokenizer::IncrementalDetokenizer(Tokenizer tokenizer, bool skip_special)
    : tokenizer_(std::move(tokenizer)),
      skip_special_(skip_special),
      spaces_to_strip_(tokenizer_.leading_spaces_to_strip()) {}

Result<std::string> IncrementalDetokenizer::push(int32_t id) {
  if (!tokenizer_.is_valid_id(id)) {
    return out_of_range("token id {} is outside the vocabulary (size {})", id,
                        tokenizer_.vocab_size());
  }
  if (skip_special_ && tokenizer_.is_special(id)) return std::string();
  std::string_view bytes = tokenizer_.token_bytes(id);
  // decode() strips leading spaces of the whole text: drop them until other bytes arrive.
  if (at_start_) {
    while (!bytes.empty() && spaces_to_strip_ > 0 && bytes.front() == ' ') {
      bytes.remove_prefix(1);
      --spaces_to_strip_;
    }
    if (!bytes.empty()) at_start_ = false;
  }
  pending_.append(bytes);
  std::string text;
  const size_t consumed = utf8::append_lossy(pending_, /*final=*/false, text);
  pending_.erase(0, consumed);
  return text;
}

std::string IncrementalDetokenizer::flush() {
  std::string text;
  utf8::append_lossy(pending_, /*final=*/true, text);
  pending_.clear();
  spaces_to_strip_ = tokenizer_.leading_spaces_to_strip();
  at_start_ = true;
  return text;
}

}  // namespace se
