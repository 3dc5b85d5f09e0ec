#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace se {
namespace {

bool ends_with_word_char(std::string_view text) {
  if (text.empty()) return false;
  size_t start = 0;
  return utf8::is_word_char(utf8::last(text, start));
}

bool starts_with_word_char(std::string_view text) {
  if (text.empty()) return false;
  size_t pos = 0;
  return utf8::is_word_char(utf8::next(text, pos));
}

// Start of the whitespace run that ends text.
size_t trailing_space_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = 0;
    if (!utf8::is_whitespace(utf8::last(text.substr(0, end), start))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that starts text.
size_t leading_space_length(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!utf8::is_whitespace(utf8::next(text, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens,
                                     std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), terminal_(1, -1), first_byte_(256, false) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& pattern = patterns[i];
    if (pattern.empty()) continue;
    first_byte_[static_cast<uint8_t>(pattern[0])] = true;
    int32_t node = 0;
    for (char c : pattern) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
      auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    terminal_[node] = static_cast<int32_t>(i);  // a repeated pattern keeps the later token
  }
}

std::pair<int32_t, size_t> AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = {terminal_[node], i + 1 - pos};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special,
                              std::vector<Segment>& out) const {
  size_t start_offset = 0;  // end of the last emitted segment
  size_t pos = 0;           // where the search for the next match resumes
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    const auto [index, length] = longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + length;
    pos = stop;
    const AddedToken& token = tokens_[index];
    if (token.special && !parse_special) continue;
    if (token.single_word) {
      const bool space_before = start == 0 || !ends_with_word_char(text.substr(0, start));
      const bool space_after = stop == text.size() || !starts_with_word_char(text.substr(stop));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    start = std::max(start, start_offset);
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace se
