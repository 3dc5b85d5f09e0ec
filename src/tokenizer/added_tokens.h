// Added tokens (HF's AddedVocabulary; GGUF control and user-defined tokens): strings matched whole
// in the input before pre-tokenization, leftmost-longest first, with HF's single_word / lstrip /
// rstrip rules. Special ones can be left unmatched so that user text is treated as plain text.
// Immutable after construction; split() is thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace se {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special =
      false;  // control token: skipped by decode(skip_special), matched only when parsing specials
  bool single_word = false;  // matches only when not inside a word
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool normalized = false;   // matched in normalized text rather than the raw input
};

class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin;
    size_t end;
    int32_t id;  // -1 for plain text between tokens
  };

  AddedTokenMatcher() = default;
  // Each token is matched by `patterns[i]` (its content, or its normalized content).
  AddedTokenMatcher(std::vector<AddedToken> tokens, std::vector<std::string> patterns);

  bool empty() const { return tokens_.empty(); }

  // Appends the segments covering text, in order. With parse_special=false, special tokens are
  // still found (so they consume their span, as in HF's encode_special_tokens mode) but their
  // span stays plain text.
  void split(std::string_view text, bool parse_special, std::vector<Segment>& out) const;

 private:
  // Longest pattern starting at text[pos]: token index and length, or {-1, 0}.
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  // Byte trie over the patterns: edges keyed by node << 8 | byte; terminal[node] is a token index.
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_;
  std::vector<bool> first_byte_;
};

}  // namespace se
