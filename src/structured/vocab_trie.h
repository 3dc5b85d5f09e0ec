// VocabTrie: a model's vocabulary as a byte trie laid out in preorder, so that a walk can skip a whole subtree
// (every token sharing a prefix the grammar refuses) with one jump. Built once per model; immutable and
// shared across threads after construction. Special (control) tokens are left out: they are never grammar text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace se {

class Tokenizer;

class VocabTrie {
 public:
  struct Entry {
    uint8_t byte = 0;
    uint32_t depth = 0;                         // bytes from the root, this one included (>= 1)
    uint32_t subtree_end = 0;                   // the first entry after this node's subtree
    uint32_t tokens_begin = 0, tokens_end = 0;  // token_ids()[begin, end) spell exactly this node's bytes
  };

  // token_bytes[id]: the bytes token `id` decodes to; empty ones (special tokens, unused ids) are left out.
  explicit VocabTrie(const std::vector<std::string>& token_bytes);
  static VocabTrie from_tokenizer(const Tokenizer& tokenizer);

  const std::vector<Entry>& entries() const { return entries_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  const std::string& bytes_of(int32_t token_id) const { return bytes_[static_cast<size_t>(token_id)]; }
  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  uint32_t max_depth() const { return max_depth_; }

 private:
  void build(uint32_t lo, uint32_t hi, uint32_t depth);

  std::vector<std::string> bytes_;  // by token id
  std::vector<int32_t> token_ids_;  // sorted by their bytes
  std::vector<Entry> entries_;
  uint32_t max_depth_ = 0;
};

}  // namespace se
