#include "engine/memory_oracle.h"

#include <algorithm>

#include "base/check.h"
#include "base/logging.h"
#include "engine/retained_ranks.h"

namespace se {
namespace {
// A resumed chain turn that computed nothing past its restored state: the state is still the chain's.
bool restored_untouched(const Request& request) {
  return request.chain_status == ChainStatus::kResumed && request.num_computed_tokens == request.num_cached_tokens;
}
}  // namespace

int64_t MemoryOracle::num_available_pages() const {
  int64_t fewest = lead().num_available_pages();
  for (size_t r = 1; r < ranks_.size(); ++r) fewest = std::min(fewest, ranks_[r]->cache().num_available_pages());
  return fewest;
}

Status MemoryOracle::admit(Request& request) {
  SE_CHECK(request.seq < 0, "request {} is already admitted", request.request_id);
  if (request.chain_state && !make_room(request.chain_state->num_pages_to_restore()))
    return resource_exhausted("request {}: {} device pages to bring its chain back from the host tier, {} available",
                              request.request_id, request.chain_state->num_pages_to_restore(), num_available_pages());
  if (request.kept_state && !make_room(request.kept_state->num_pages_to_restore()))
    return resource_exhausted("request {}: {} device pages to resume its kept state, {} available", request.request_id,
                              request.kept_state->num_pages_to_restore(), num_available_pages());
  const int32_t seq = next_seq_++;
  if (request.kept_state) {
    // It goes on as if never preempted: the same computed tokens, and its prefill ends where it did.
    Result<int32_t> resumed = ranks_[0]->resume(seq, std::move(request.kept_state));
    if (resumed.is_ok()) {
      request.num_computed_tokens = *resumed;
      request.seq = seq;
      return Status::ok();
    }
    // The state is lost: the request recomputes its tokens, as one preempted without room on the host does.
    SE_LOG_WARN("request {}: its kept state could not be resumed ({}); recomputing its {} tokens", request.request_id,
                resumed.status().message(), request.num_tokens());
    request.num_computed_tokens = 0;
  }
  SE_ASSIGN_OR_RETURN(const int32_t num_cached, open_on_every_rank(seq, request));
  request.seq = seq;
  request.num_computed_tokens = num_cached;
  request.num_cached_tokens = num_cached;
  request.num_prefill_tokens = request.num_tokens();
  return Status::ok();
}

Result<int32_t> MemoryOracle::open_on_every_rank(int32_t seq, Request& request) {
  if (!request.chain_state && request.chain_status == ChainStatus::kResumed)
    request.chain_status = ChainStatus::kRebuilt;
  std::vector<std::unique_ptr<ChainState>> states;
  if (request.chain_state && ranks_.size() == 1) {
    states.push_back(std::move(request.chain_state));
  } else if (request.chain_state) {
    auto* retained = dynamic_cast<RetainedRanks*>(request.chain_state.get());
    if (retained == nullptr || retained->num_ranks() != ranks_.size())
      return invalid_argument("request {}: its chain was not retained by this engine's {} ranks", request.request_id,
                              ranks_.size());
    states = retained->take_ranks();
    request.chain_state.reset();
  }
  if (!states.empty()) {
    Result<int32_t> resumed =
        on_every_rank(seq, request, [&](size_t r) { return ranks_[r]->resume(seq, std::move(states[r])); });
    if (resumed.is_ok()) return resumed;
    // A chain that cannot come back on every rank is rebuilt from its tokens, as one whose state was reclaimed is:
    // the turn costs a prefill, not an error.
    SE_LOG_WARN("request {}: its chain could not be resumed ({}); rebuilding it from its {} tokens", request.request_id,
                resumed.status().message(), request.token_ids.size());
    request.chain_status = ChainStatus::kRebuilt;
  }
  return on_every_rank(seq, request, [&](size_t r) { return ranks_[r]->open(seq, request.token_ids); });
}

Result<int32_t> MemoryOracle::on_every_rank(int32_t seq, const Request& request,
                                            const std::function<Result<int32_t>(size_t rank)>& open) {
  int32_t num_cached = 0;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Result<int32_t> opened = open(r);
    if (!opened.is_ok()) {
      close_on_ranks(seq, r);
      return opened.status();
    }
    // The ranks' caches change in step (the same calls, the same page counts), so their prefix caches agree.
    SE_CHECK(r == 0 || *opened == num_cached, "rank {} opened request {} on {} cached tokens, rank 0 on {}", r,
             request.request_id, *opened, num_cached);
    num_cached = *opened;
  }
  return num_cached;
}

void MemoryOracle::close_on_ranks(int32_t seq, size_t end) {
  for (size_t r = 0; r < end; ++r) ranks_[r]->close(seq);
}

bool MemoryOracle::try_reserve(Request& request, int32_t num_tokens) {
  const bool completes_prefill = request.num_computed_tokens < request.num_prefill_tokens &&
                                 request.num_computed_tokens + num_tokens >= request.num_prefill_tokens;
  int64_t headroom = num_headroom_pages_;
  if (completes_prefill)
    for (const SparseController* rank : ranks_)
      headroom = std::max(headroom, rank->transient_pages(request.num_prefill_tokens));
  std::vector<int64_t> needed;
  needed.reserve(ranks_.size());
  for (const SparseController* rank : ranks_)
    needed.push_back(rank->cache().pages_to_reserve(request.seq, num_tokens) + headroom);
  if (!make_room(needed)) return false;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const bool reserved = ranks_[r]->cache().reserve(request.seq, num_tokens).is_ok();
    if (r == 0 && !reserved) return false;
    // Every rank had the room rank 0 had, and reserve fails only for want of room.
    SE_CHECK(reserved, "rank {} could not reserve {} tokens of request {} that rank 0 reserved", r, num_tokens,
             request.request_id);
  }
  num_headroom_pages_ = headroom;
  return true;
}

bool MemoryOracle::make_room(const std::vector<int64_t>& num_pages) {
  const auto shortfall = [&] {
    int64_t most = 0;
    for (size_t r = 0; r < ranks_.size(); ++r)
      most = std::max(most, num_pages[r] - ranks_[r]->cache().num_available_pages());
    return most;
  };
  // A reclaimed chain frees at least its num_held_pages on every rank (RetainedRanks).
  if (chains_ != nullptr && shortfall() > 0) chains_->reclaim(shortfall());
  // Where running sequences live in the host tier too, the idle chains there give it back, oldest first, while that
  // helps: once the host has room for every resident page it could take, what is short is device pages, and
  // dropping more chains gains nothing.
  if (chains_ != nullptr && lead().runs_on_host_tier()) chains_->drop_host_chains_while_short(shortfall);
  return shortfall() <= 0;
}

void MemoryOracle::commit(Request& request) {
  for (SparseController* rank : ranks_)
    rank->cache().on_computed(request.seq, request.token_ids, request.num_computed_tokens);
}

bool MemoryOracle::fits_at_peak(std::span<Request* const> running, const Request& candidate) const {
  // A request admitted, or kept on the host tier, goes on from the prompt its admission set; any other recomputes
  // every token it knows as its prompt.
  const auto peak_pages = [](const SparseController& rank, const Request& r) {
    const int32_t prompt = r.seq >= 0 || r.kept_state ? r.num_prefill_tokens : r.num_tokens();
    return rank.peak_pages(prompt, std::max(0, r.params.max_tokens - (prompt - r.num_prompt_tokens)));
  };
  for (const SparseController* rank : ranks_) {
    int64_t pages = peak_pages(*rank, candidate);
    for (const Request* r : running) pages += peak_pages(*rank, *r);
    if (pages > rank->cache().num_total_pages()) return false;
  }
  return true;
}

void MemoryOracle::preempt(Request& request) {
  if (request.seq < 0 || request.num_computed_tokens == 0 || restored_untouched(request) || ranks_.size() != 1 ||
      !lead().runs_on_host_tier()) {
    release(request);
    return;
  }
  std::unique_ptr<ChainState> state = retain_on_every_rank(request.seq);
  request.seq = -1;
  if (park_on_host(*state).is_ok()) {
    request.kept_state = std::move(state);
    return;
  }
  // The host tier lacks room for it: its pages go back and it recomputes its tokens.
  request.num_computed_tokens = 0;
}

void MemoryOracle::release(Request& request) {
  if (request.seq < 0) return;
  if (restored_untouched(request)) {
    request.chain_state = retain_on_every_rank(request.seq);
    // Where running sequences live in the host tier, the device keeps only their pages: the state goes back there,
    // or is lost as a reclaimed chain's is (the turn is rebuilt from its tokens; aborted, its chain is dropped).
    if (lead().runs_on_host_tier()) {
      const Status parked = park_on_host(*request.chain_state);
      if (!parked.is_ok()) {
        SE_LOG_WARN("request {}: its chain's state cannot go back to the host tier ({}); the turn will rebuild it",
                    request.request_id, parked.message());
        request.chain_state.reset();
      }
    }
  } else {
    close_on_ranks(request.seq, ranks_.size());
  }
  request.seq = -1;
  request.num_computed_tokens = 0;
}

Status MemoryOracle::park_on_host(ChainState& state) {
  // A request's state comes before idle chains: they leave the host, oldest first, when that makes room for it.
  return chains_ != nullptr ? chains_->offload_state(state) : state.offload();
}

std::unique_ptr<ChainState> MemoryOracle::retain(Request& request) {
  SE_CHECK(request.seq >= 0, "request {} holds no cache state to retain", request.request_id);
  std::unique_ptr<ChainState> state = retain_on_every_rank(request.seq);
  request.seq = -1;
  request.num_computed_tokens = 0;
  return state;
}

std::unique_ptr<ChainState> MemoryOracle::retain_on_every_rank(int32_t seq) {
  if (ranks_.size() == 1) return ranks_[0]->retain(seq);
  std::vector<std::unique_ptr<ChainState>> states;
  states.reserve(ranks_.size());
  for (SparseController* rank : ranks_) states.push_back(rank->retain(seq));
  return std::make_unique<RetainedRanks>(std::move(states));
}

}  // namespace se
