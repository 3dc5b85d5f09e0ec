#include "structured/grammar_matcher.h"

#include <algorithm>
#include <limits>

namespace se {

namespace {

// Masks remembered per request at most (about 6 KiB each for a 49K vocabulary).
constexpr size_t kMaxCachedMasks = 256;

void set_bit(std::vector<uint64_t>& bits, int32_t i) {
  bits[static_cast<size_t>(i) / 64] |= uint64_t{1} << (static_cast<size_t>(i) % 64);
}

bool bit(const std::vector<uint64_t>& bits, int32_t i) {
  return (bits[static_cast<size_t>(i) / 64] >> (static_cast<size_t>(i) % 64)) & 1;
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const TokenGrammar> grammar)
    : grammar_(std::move(grammar)), state_(grammar_->grammar) {
  walk_.resize(grammar_->vocab->max_depth() + 1);
}

std::vector<uint64_t> GrammarMatcher::compute_allowed() {
  const VocabTrie& trie = *grammar_->vocab;
  const JsonGrammar& grammar = grammar_->grammar;
  std::vector<uint64_t> bits((static_cast<size_t>(trie.vocab_size()) + 63) / 64, 0);
  walk_[0].copy_from(state_);
  const std::vector<VocabTrie::Entry>& entries = trie.entries();
  const std::vector<int32_t>& ids = trie.token_ids();
  for (uint32_t i = 0; i < entries.size();) {
    const VocabTrie::Entry& e = entries[i];
    GrammarState& s = walk_[e.depth];
    s.copy_from(walk_[e.depth - 1]);
    if (!s.advance(grammar, e.byte)) {
      i = e.subtree_end;
      continue;
    }
    for (uint32_t t = e.tokens_begin; t < e.tokens_end; ++t) set_bit(bits, ids[t]);
    ++i;
  }
  if (state_.accepting(grammar))
    for (int32_t id : grammar_->eog_ids)
      if (id < trie.vocab_size()) set_bit(bits, id);
  return bits;
}

const std::vector<uint64_t>& GrammarMatcher::allowed_tokens() {
  std::string key = state_.key();
  if (mask_ != nullptr && key == key_) return *mask_;
  auto it = masks_.find(key);
  if (it == masks_.end()) {
    if (masks_.size() >= kMaxCachedMasks) masks_.clear();
    it = masks_.emplace(key, compute_allowed()).first;
  }
  key_ = std::move(key);
  mask_ = &it->second;
  return *mask_;
}

bool GrammarMatcher::is_allowed(int32_t token_id) {
  return token_id >= 0 && token_id < grammar_->vocab->vocab_size() && bit(allowed_tokens(), token_id);
}

void GrammarMatcher::write_next_tokens(std::span<uint64_t> words) {
  const std::vector<uint64_t>& allowed = allowed_tokens();
  std::fill(words.begin(), words.end(), 0);
  if (std::any_of(allowed.begin(), allowed.end(), [](uint64_t w) { return w != 0; })) {
    // `allowed` has no bits past the vocabulary, which a padded logits row may outrun.
    std::copy_n(allowed.begin(), std::min(allowed.size(), words.size()), words.begin());
    return;
  }
  for (int32_t id : grammar_->eog_ids)
    if (static_cast<size_t>(id) / 64 < words.size()) words[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
}

void GrammarMatcher::mask_logits(std::span<float> logits) {
  next_tokens_.resize((logits.size() + 63) / 64);
  write_next_tokens(next_tokens_);
  constexpr float kRefused = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!bit(next_tokens_, static_cast<int32_t>(i))) logits[i] = kRefused;
}

bool GrammarMatcher::accept(int32_t token_id) {
  if (std::find(grammar_->eog_ids.begin(), grammar_->eog_ids.end(), token_id) != grammar_->eog_ids.end())
    return state_.accepting(grammar_->grammar);
  if (token_id < 0 || token_id >= grammar_->vocab->vocab_size()) return false;
  const std::string& bytes = grammar_->vocab->bytes_of(token_id);
  if (bytes.empty()) return false;
  GrammarState next;
  next.copy_from(state_);
  for (char c : bytes)
    if (!next.advance(grammar_->grammar, static_cast<uint8_t>(c))) return false;
  state_.copy_from(next);
  return true;
}

}  // namespace se
