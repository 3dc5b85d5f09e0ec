// RetainedRanks: a Chain Cache turn retained on every tensor-parallel rank: rank r's RetainedSequence, of the KV
// heads rank r holds. The MemoryOracle makes one when a sharded engine retains a turn and hands each rank its part
// back when the chain resumes. Owning: it holds every rank's pages until resumed or destroyed (on the engine thread).
// Stays in device pages: a sharded engine keeps no host tier.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kv/chain_cache.h"

namespace se {

class RetainedRanks final : public ChainState {
 public:
  // Precondition: one state per rank, rank 0's first, all of the same logical tokens.
  explicit RetainedRanks(std::vector<std::unique_ptr<ChainState>> ranks) : ranks_(std::move(ranks)) {}

  // The fewest pages a rank holds: what dropping the state frees on every rank.
  int64_t num_held_pages() const override {
    int64_t fewest = ranks_[0]->num_held_pages();
    for (const auto& rank : ranks_) fewest = std::min(fewest, rank->num_held_pages());
    return fewest;
  }
  int32_t num_logical_tokens() const override { return ranks_[0]->num_logical_tokens(); }
  // Never offloaded: the host tier keeps no state of several ranks.
  int64_t num_host_pages_short() const override { return 0; }
  // The most any rank's streams may take (the ranks keep the same store, so all of them bound it or none).
  std::optional<int64_t> num_pages_to_extend(int64_t num_new_tokens) const override {
    std::optional<int64_t> most;
    for (const auto& rank : ranks_) {
      const std::optional<int64_t> pages = rank->num_pages_to_extend(num_new_tokens);
      if (!pages) return std::nullopt;
      most = std::max(most.value_or(0), *pages);
    }
    return most;
  }
  size_t num_ranks() const { return ranks_.size(); }

  std::vector<std::unique_ptr<ChainState>> take_ranks() { return std::move(ranks_); }

 private:
  std::vector<std::unique_ptr<ChainState>> ranks_;
};

}  // namespace se
