// BpeModel: byte-pair encoding of one pre-tokenized piece, with HF tokenizers' semantics: the
// piece starts as one symbol per character (or byte-fallback <0xXX> tokens, or unk), then the
// adjacent pair of lowest rank merges first, ties going to the leftmost pair. Ranks come from an
// explicit merge list, or, for SentencePiece vocabularies that store none, from a per-token
// priority: a pair merges when its concatenation is a token, ranked by that token's priority and
// then by a longer left part (the order transformers' generate_merges gives them).
// Immutable after construction apart from an internal word cache; encode() is thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tokenizer/vocab.h"

namespace se {

class BpeModel {
 public:
  struct Options {
    bool byte_fallback = false;  // unknown characters become their <0xXX> byte tokens
    int32_t unk_id = -1;         // token for characters with no token; -1 drops them
    bool fuse_unk = false;       // consecutive unknown characters share one unk token
    bool ignore_merges = false;  // a piece that is itself a token maps to it directly
  };

  // Merge i has rank i. Errors name the first merge whose parts or concatenation are not tokens.
  static Result<BpeModel> from_merges(
      std::shared_ptr<const Vocab> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, Options options);
  // priority[id] orders the tokens as merge results (lower merges first); size == vocab->size().
  static BpeModel from_priorities(std::shared_ptr<const Vocab> vocab,
                                  std::vector<uint32_t> priority, Options options);

  // Appends the ids of one piece (in the vocab's alphabet, valid UTF-8).
  void encode(std::string_view piece, std::vector<int32_t>& ids) const;

 private:
  struct Merge {
    uint64_t rank;
    int32_t new_id;
  };
  struct WordCache {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
  };

  BpeModel(std::shared_ptr<const Vocab> vocab, Options options);
  std::optional<Merge> find_merge(int32_t left, int32_t right) const;
  void encode_uncached(std::string_view piece, std::vector<int32_t>& ids) const;

  std::shared_ptr<const Vocab> vocab_;
  Options options_;
  std::unordered_map<uint64_t, Merge> merges_;  // key: left id << 32 | right id
  std::vector<uint32_t> priority_;              // used when merges_ is empty
  std::array<int32_t, 256> byte_ids_{};         // <0xXX> token per byte, or -1
  std::unique_ptr<WordCache> cache_ = std::make_unique<WordCache>();
};

}  // namespace se
