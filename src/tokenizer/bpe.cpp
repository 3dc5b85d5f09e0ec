#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <queue>

#include "tokenizer/utf8.h"

namespace se {
namespace {

constexpr size_t kMaxCachedPieceBytes = 256;
constexpr size_t kMaxCachedPieces = 1 << 17;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes of the piece it covers; 0 once merged into its left neighbour
};

struct Candidate {
  uint64_t rank;
  int32_t pos;
  int32_t new_id;
  // std::priority_queue pops the largest: invert so the lowest rank, then leftmost, comes first.
  bool operator<(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

}  // namespace

BpeModel::BpeModel(std::shared_ptr<const Vocab> vocab, Options options)
    : vocab_(std::move(vocab)), options_(options) {
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = vocab_->find(fmt::format("<0x{:02X}>", b)).value_or(-1);
  }
}

Result<BpeModel> BpeModel::from_merges(
    std::shared_ptr<const Vocab> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, Options options) {
  BpeModel model(std::move(vocab), options);
  model.merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [left, right] = merges[i];
    const auto left_id = model.vocab_->find(left);
    const auto right_id = model.vocab_->find(right);
    const auto new_id = model.vocab_->find(left + right);
    if (!left_id || !right_id || !new_id) {
      return invalid_argument("merge {} ('{}' '{}'): {} is not in the vocabulary", i, left, right,
                              !left_id    ? "'" + left + "'"
                              : !right_id ? "'" + right + "'"
                                          : "the merged token");
    }
    // A repeated pair keeps its last rank, as HF's merge map does.
    model.merges_.insert_or_assign(pair_key(*left_id, *right_id), Merge{i, *new_id});
  }
  return model;
}

BpeModel BpeModel::from_priorities(std::shared_ptr<const Vocab> vocab,
                                   std::vector<uint32_t> priority, Options options) {
  BpeModel model(std::move(vocab), options);
  model.priority_ = std::move(priority);
  return model;
}

std::optional<BpeModel::Merge> BpeModel::find_merge(int32_t left, int32_t right) const {
  if (priority_.empty()) {
    auto it = merges_.find(pair_key(left, right));
    if (it == merges_.end()) return std::nullopt;
    return it->second;
  }
  const std::string& a = vocab_->spelling(left);
  std::string joined;
  joined.reserve(a.size() + vocab_->spelling(right).size());
  joined += a;
  joined += vocab_->spelling(right);
  const auto id = vocab_->find(joined);
  if (!id) return std::nullopt;
  // Among the splits of one token, a longer left part ranks first.
  const uint64_t rank = (static_cast<uint64_t>(priority_[*id]) << 32) | (0xFFFFFFFFu - a.size());
  return Merge{rank, *id};
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = vocab_->find(piece)) {
      ids.push_back(*id);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->words.find(piece);
    if (it != cache_->words.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  encode_uncached(piece, ids);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->words.size() >= kMaxCachedPieces) cache_->words.clear();
    cache_->words.try_emplace(std::string(piece), ids.begin() + static_cast<std::ptrdiff_t>(first),
                              ids.end());
  }
}

void BpeModel::encode_uncached(std::string_view piece, std::vector<int32_t>& ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  auto push = [&](int32_t id, uint32_t len) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, len});
  };
  bool last_is_unk = false;
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t start = pos;
    utf8::next(piece, pos);
    const std::string_view ch = piece.substr(start, pos - start);
    if (auto id = vocab_->find(ch)) {
      push(*id, static_cast<uint32_t>(ch.size()));
      last_is_unk = false;
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (char c : ch) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        for (char c : ch) push(byte_ids_[static_cast<uint8_t>(c)], 1);
        last_is_unk = false;
        continue;
      }
    }
    if (options_.unk_id < 0) continue;
    if (options_.fuse_unk && last_is_unk) {
      symbols.back().len += static_cast<uint32_t>(ch.size());
    } else {
      push(options_.unk_id, static_cast<uint32_t>(ch.size()));
    }
    last_is_unk = true;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t at) {
    const int32_t next = symbols[at].next;
    if (next < 0) return;
    if (auto merge = find_merge(symbols[at].id, symbols[next].id)) {
      queue.push({merge->rank, at, merge->new_id});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const int32_t right_pos = left.next;
    Symbol& right = symbols[right_pos];
    // Stale entry: the pair at this position has changed since it was queued.
    auto current = find_merge(left.id, right.id);
    if (!current || current->new_id != top.new_id) continue;
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace se
