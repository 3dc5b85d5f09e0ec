// Vocab: the id <-> spelling table of a tokenizer model. Spellings are in the model's alphabet
// (byte-level characters, or SentencePiece's U+2581 for spaces). Ids may leave holes (HF added
// tokens can sit past the model vocabulary). Lookups by spelling go through an open-addressing
// table, the hot path of BPE. Immutable once built; safe to share between threads.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace se {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Vocab {
 public:
  // Sets id's spelling (id >= 0). When two ids share a spelling, find() returns the later set.
  void set(int32_t id, std::string spelling);

  std::optional<int32_t> find(std::string_view spelling) const;
  bool contains(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < present_.size() && present_[id];
  }
  // Precondition: contains(id).
  const std::string& spelling(int32_t id) const { return spellings_[id]; }
  // One past the largest id.
  int32_t size() const { return static_cast<int32_t>(spellings_.size()); }

 private:
  // A slot holds (hash tag << 32) | (id + 1); 0 marks an empty slot.
  static uint64_t slot(uint32_t tag, int32_t id) {
    return (static_cast<uint64_t>(tag) << 32) | static_cast<uint32_t>(id + 1);
  }
  void insert_slot(uint64_t value);
  void grow();

  std::vector<std::string> spellings_;
  std::vector<bool> present_;
  std::vector<uint64_t> slots_;  // power-of-two size, linear probing
  size_t num_used_ = 0;
};

}  // namespace se
