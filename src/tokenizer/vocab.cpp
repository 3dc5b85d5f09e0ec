#include "tokenizer/vocab.h"

namespace se {
namespace {

uint32_t tag_of(size_t hash) {
  return static_cast<uint32_t>(hash >> 32) ^ static_cast<uint32_t>(hash);
}

}  // namespace

void Vocab::insert_slot(uint64_t value) {
  const size_t mask = slots_.size() - 1;
  for (size_t i = (value >> 32) & mask;; i = (i + 1) & mask) {
    if (slots_[i] == 0) {
      slots_[i] = value;
      ++num_used_;
      return;
    }
  }
}

void Vocab::grow() {
  std::vector<uint64_t> old = std::move(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, 0);
  num_used_ = 0;
  for (uint64_t value : old) {
    if (value != 0) insert_slot(value);
  }
}

void Vocab::set(int32_t id, std::string spelling) {
  if (static_cast<size_t>(id) >= spellings_.size()) {
    spellings_.resize(id + 1);
    present_.resize(id + 1, false);
  }
  if ((num_used_ + 1) * 2 > slots_.size()) grow();
  const uint32_t tag = tag_of(StringHash{}(spelling));
  spellings_[id] = std::move(spelling);
  present_[id] = true;
  // Take over the slot of an earlier id with the same spelling, if any.
  const size_t mask = slots_.size() - 1;
  for (size_t i = tag & mask; slots_[i] != 0; i = (i + 1) & mask) {
    const auto other = static_cast<int32_t>(static_cast<uint32_t>(slots_[i]) - 1);
    if ((slots_[i] >> 32) == tag && spellings_[other] == spellings_[id]) {
      slots_[i] = slot(tag, id);
      return;
    }
  }
  insert_slot(slot(tag, id));
}

std::optional<int32_t> Vocab::find(std::string_view spelling) const {
  if (slots_.empty()) return std::nullopt;
  const uint32_t tag = tag_of(StringHash{}(spelling));
  const size_t mask = slots_.size() - 1;
  for (size_t i = tag & mask; slots_[i] != 0; i = (i + 1) & mask) {
    if ((slots_[i] >> 32) != tag) continue;
    const auto id = static_cast<int32_t>(static_cast<uint32_t>(slots_[i]) - 1);
    if (spellings_[id] == spelling) return id;
  }
  return std::nullopt;
}

}  // namespace se
