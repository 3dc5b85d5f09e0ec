#include "structured/vocab_trie.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace se {

VocabTrie::VocabTrie(const std::vector<std::string>& token_bytes) : bytes_(token_bytes) {
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty()) token_ids_.push_back(static_cast<int32_t>(id));
  std::sort(token_ids_.begin(), token_ids_.end(),
            [this](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  build(0, static_cast<uint32_t>(token_ids_.size()), 0);
}

VocabTrie VocabTrie::from_tokenizer(const Tokenizer& tokenizer) {
  std::vector<std::string> bytes(static_cast<size_t>(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id)
    if (tokenizer.is_valid_id(id) && !tokenizer.is_special(id))
      bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
  return VocabTrie(bytes);
}

// Tokens [lo, hi) share their first `depth` bytes and are longer than that; sorted, so each next byte's tokens
// are one run, its shortest (those ending at the child) first.
void VocabTrie::build(uint32_t lo, uint32_t hi, uint32_t depth) {
  auto byte_at = [this, depth](uint32_t i) {
    return static_cast<uint8_t>(bytes_[static_cast<size_t>(token_ids_[i])][depth]);
  };
  max_depth_ = std::max(max_depth_, depth);
  while (lo < hi) {
    const uint8_t byte = byte_at(lo);
    uint32_t end = lo;
    while (end < hi && byte_at(end) == byte) ++end;
    uint32_t ending = lo;  // tokens that end at the child
    while (ending < end && bytes_[static_cast<size_t>(token_ids_[ending])].size() == depth + 1) ++ending;
    const size_t at = entries_.size();
    entries_.push_back({byte, depth + 1, 0, lo, ending});
    build(ending, end, depth + 1);
    entries_[at].subtree_end = static_cast<uint32_t>(entries_.size());
    lo = end;
  }
}

}  // namespace se
