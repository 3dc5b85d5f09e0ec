#include "kv/chain_cache.h"

#include <xxhash.h>

#include "base/check.h"

namespace se {

uint64_t token_digest(std::span<const int32_t> tokens) { return XXH3_64bits(tokens.data(), tokens.size_bytes()); }

Status ChainCacheIndex::create(const std::string& chain_id, const std::string& fingerprint) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (chains_.count(chain_id) != 0 || is_tombstoned(chain_id))
    return invalid_argument("chain id '{}' is already in use", chain_id);
  Chain& chain = chains_[chain_id];
  chain.fingerprint = fingerprint;
  chain.digest = token_digest({});
  return Status::ok();
}

Result<ChainCacheIndex::IdleState> ChainCacheIndex::take_idle(const std::string& chain_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chains_.find(chain_id);
  if (it == chains_.end()) {
    if (is_tombstoned(chain_id)) return gone("chain '{}' was reclaimed", chain_id);
    return not_found("chain '{}' does not exist", chain_id);
  }
  Chain& chain = it->second;
  if (!chain.state) return conflict("chain '{}' is busy: a turn is in flight", chain_id);
  leave_lru(chain);
  return IdleState{std::move(chain.state), chain.tokens};
}

Result<std::unique_ptr<ChainState>> ChainCacheIndex::begin_turn(const std::string& chain_id,
                                                                 const std::string& fingerprint,
                                                                 std::span<const int32_t> tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chains_.find(chain_id);
  if (it == chains_.end()) {
    if (is_tombstoned(chain_id))
      return gone("chain '{}' was reclaimed; start a new chain with the full conversation", chain_id);
    return not_found("chain '{}' does not exist", chain_id);
  }
  Chain& chain = it->second;
  if (!chain.state) return conflict("chain '{}' is busy: a turn is in flight", chain_id);
  if (chain.fingerprint != fingerprint)
    return conflict("chain '{}' was made under other settings ({}) than this server's ({})", chain_id,
                    chain.fingerprint, fingerprint);
  const size_t n = chain.tokens.size();
  if (tokens.size() <= n || token_digest(tokens.first(n)) != chain.digest)
    return conflict("the prompt ({} tokens) does not extend chain '{}''s {} cached tokens", tokens.size(), chain_id,
                    n);
  leave_lru(chain);
  return std::move(chain.state);
}

void ChainCacheIndex::make_idle(const std::string& chain_id, Chain& chain) {
  std::list<std::string>& lru = chain.state->is_offloaded() ? host_lru_ : lru_;
  chain.lru_it = lru.insert(lru.end(), chain_id);
  num_reclaimable_pages_ += chain.state->num_held_pages();
  num_host_pages_ += chain.state->num_host_pages();
}

void ChainCacheIndex::leave_lru(Chain& chain) {
  (chain.state->is_offloaded() ? host_lru_ : lru_).erase(chain.lru_it);
  num_reclaimable_pages_ -= chain.state->num_held_pages();
  num_host_pages_ -= chain.state->num_host_pages();
}

bool ChainCacheIndex::offload_locked(const std::string& chain_id, Chain& chain) {
  leave_lru(chain);
  if (!offload_making_room(*chain.state).is_ok()) return false;
  make_idle(chain_id, chain);
  return true;
}

Status ChainCacheIndex::offload_state(ChainState& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  return offload_making_room(state);
}

Status ChainCacheIndex::offload_making_room(ChainState& state) {
  Status offloaded = state.offload();
  if (offloaded.code() != StatusCode::kResourceExhausted) return offloaded;
  if (state.num_host_pages_short() > num_pages_of_host_chains()) return offloaded;
  drop_host_chains_locked([&] { return state.num_host_pages_short(); });
  return state.offload();
}

void ChainCacheIndex::drop_host_chains_while_short(const std::function<int64_t()>& short_by) {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_host_chains_locked(short_by);
}

void ChainCacheIndex::drop_host_chains_locked(const std::function<int64_t()>& short_by) {
  for (int64_t missing = short_by(); missing > 0 && !host_lru_.empty();) {
    const std::string oldest = host_lru_.front();  // a copy: dropping erases the list entry
    drop_locked(oldest);
    const int64_t now_missing = short_by();
    if (now_missing >= missing) break;
    missing = now_missing;
  }
}

int64_t ChainCacheIndex::num_pages_of_host_chains() const {
  int64_t num_pages = 0;
  for (const std::string& chain_id : host_lru_) num_pages += chains_.at(chain_id).state->num_host_pages();
  return num_pages;
}

void ChainCacheIndex::end_turn(const std::string& chain_id, std::vector<int32_t> tokens,
                               std::unique_ptr<ChainState> state) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chains_.find(chain_id);
  SE_CHECK(it != chains_.end() && !it->second.state && state, "chain '{}' has no turn in flight", chain_id);
  Chain& chain = it->second;
  chain.digest = token_digest(tokens);
  chain.tokens = std::move(tokens);
  chain.state = std::move(state);
  make_idle(chain_id, chain);
}

void ChainCacheIndex::cancel_turn(const std::string& chain_id, std::unique_ptr<ChainState> state) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chains_.find(chain_id);
  SE_CHECK(it != chains_.end() && !it->second.state && state, "chain '{}' has no turn in flight", chain_id);
  it->second.state = std::move(state);
  make_idle(chain_id, it->second);
}

void ChainCacheIndex::tombstone(const std::string& chain_id) {
  if (!tombstone_set_.insert(chain_id).second) return;
  tombstones_.push_back(chain_id);
  while (static_cast<int32_t>(tombstones_.size()) > max_tombstones_) {
    tombstone_set_.erase(tombstones_.front());
    tombstones_.pop_front();
  }
}

void ChainCacheIndex::drop(const std::string& chain_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_locked(chain_id);
}

void ChainCacheIndex::drop_locked(const std::string& chain_id) {
  auto it = chains_.find(chain_id);
  if (it == chains_.end()) return;
  if (it->second.state) leave_lru(it->second);
  chains_.erase(it);  // releases the state's pages
  tombstone(chain_id);
}

int64_t ChainCacheIndex::reclaim(int64_t num_pages) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t num_released = 0;
  while (num_released < num_pages && !lru_.empty()) {
    const std::string chain_id = lru_.front();
    Chain& chain = chains_.at(chain_id);
    num_released += chain.state->num_held_pages();
    park_locked(chain_id, chain);
  }
  return num_released;
}

void ChainCacheIndex::park(const std::string& chain_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chains_.find(chain_id);
  if (it == chains_.end() || !it->second.state || it->second.state->is_offloaded()) return;
  park_locked(chain_id, it->second);
}

void ChainCacheIndex::park_locked(const std::string& chain_id, Chain& chain) {
  if (offload_locked(chain_id, chain)) return;
  chains_.erase(chain_id);  // out of every LRU already; releases the state's pages
  tombstone(chain_id);
}

std::optional<ChainInfo> ChainCacheIndex::find(const std::string& chain_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chains_.find(chain_id);
  if (it == chains_.end()) return std::nullopt;
  const Chain& chain = it->second;
  return ChainInfo{chain_id,
                   !chain.state,
                   static_cast<int32_t>(chain.tokens.size()),
                   chain.digest,
                   chain.state ? chain.state->num_held_pages() : 0,
                   chain.state && chain.state->is_offloaded(),
                   chain.state ? chain.state->num_host_pages() : 0};
}

std::vector<int32_t> ChainCacheIndex::prefix(const std::string& chain_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = chains_.find(chain_id);
  if (it == chains_.end() || !it->second.state) return {};
  return it->second.tokens;
}

int32_t ChainCacheIndex::num_chains() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int32_t>(chains_.size());
}

int32_t ChainCacheIndex::num_idle_chains() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int32_t>(lru_.size() + host_lru_.size());
}

int32_t ChainCacheIndex::num_chains_on_host() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int32_t>(host_lru_.size());
}

int64_t ChainCacheIndex::num_host_pages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_host_pages_;
}

int64_t ChainCacheIndex::num_reclaimable_pages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_reclaimable_pages_;
}

Status ChainCacheIndex::check_integrity() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t num_on_device = 0, num_on_host = 0;
  int64_t num_device_pages = 0, num_host_pages = 0;
  for (const auto& [chain_id, chain] : chains_) {
    if (is_tombstoned(chain_id)) return internal_error("chain '{}' is live and tombstoned", chain_id);
    if (chain.digest != token_digest(chain.tokens)) return internal_error("chain '{}': stale digest", chain_id);
    if (!chain.state) continue;
    ++(chain.state->is_offloaded() ? num_on_host : num_on_device);
    num_device_pages += chain.state->num_held_pages();
    num_host_pages += chain.state->num_host_pages();
    if (*chain.lru_it != chain_id) return internal_error("chain '{}': LRU entry names another chain", chain_id);
  }
  if (num_on_device != lru_.size() || num_on_host != host_lru_.size())
    return internal_error("{} idle chains on the device and {} on the host, but {} and {} LRU entries", num_on_device,
                          num_on_host, lru_.size(), host_lru_.size());
  if (num_device_pages != num_reclaimable_pages_ || num_host_pages != num_host_pages_)
    return internal_error("idle chains hold {} device and {} host pages, the running totals say {} and {}",
                          num_device_pages, num_host_pages, num_reclaimable_pages_, num_host_pages_);
  if (tombstones_.size() != tombstone_set_.size() || static_cast<int32_t>(tombstones_.size()) > max_tombstones_)
    return internal_error("{} tombstones ({} distinct, bound {})", tombstones_.size(), tombstone_set_.size(),
                          max_tombstones_);
  return Status::ok();
}

}  // namespace se
