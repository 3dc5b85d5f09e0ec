#include "engine/memory_oracle.h"

#include <algorithm>

#include "base/check.h"

namespace se {

Status MemoryOracle::admit(Request& request) {
  SE_CHECK(request.seq < 0, "request {} is already admitted", request.request_id);
  if (request.chain_state && !make_room(request.chain_state->num_pages_to_restore()))
    return resource_exhausted("request {}: {} device pages to bring its chain back from the host tier, {} available",
                              request.request_id, request.chain_state->num_pages_to_restore(),
                              cache_.num_available_pages());
  const int32_t seq = next_seq_++;
  int32_t num_cached = 0;
  if (request.chain_state) {
    SE_ASSIGN_OR_RETURN(num_cached, controller_.resume(seq, std::move(request.chain_state)));
  } else {
    if (request.chain_status == ChainStatus::kResumed) request.chain_status = ChainStatus::kRebuilt;
    SE_ASSIGN_OR_RETURN(num_cached, controller_.open(seq, request.token_ids));
  }
  request.seq = seq;
  request.num_computed_tokens = num_cached;
  request.num_cached_tokens = num_cached;
  request.num_prefill_tokens = request.num_tokens();
  return Status::ok();
}

bool MemoryOracle::try_reserve(Request& request, int32_t num_tokens) {
  int64_t headroom = num_headroom_pages_;
  if (request.num_computed_tokens < request.num_prefill_tokens &&
      request.num_computed_tokens + num_tokens >= request.num_prefill_tokens)
    headroom = std::max(headroom, controller_.transient_pages(request.num_prefill_tokens));
  if (!make_room(cache_.pages_to_reserve(request.seq, num_tokens) + headroom)) return false;
  if (!cache_.reserve(request.seq, num_tokens).is_ok()) return false;
  num_headroom_pages_ = headroom;
  return true;
}

bool MemoryOracle::make_room(int64_t num_pages) {
  if (num_pages > cache_.num_available_pages() && chains_ != nullptr)
    chains_->reclaim(num_pages - cache_.num_available_pages());
  return num_pages <= cache_.num_available_pages();
}

void MemoryOracle::commit(Request& request) {
  cache_.on_computed(request.seq, request.token_ids, request.num_computed_tokens);
}

void MemoryOracle::release(Request& request) {
  if (request.seq < 0) return;
  const bool restored_untouched =
      request.chain_status == ChainStatus::kResumed && request.num_computed_tokens == request.num_cached_tokens;
  if (restored_untouched) {
    request.chain_state = controller_.retain(request.seq);
  } else {
    controller_.close(request.seq);
  }
  request.seq = -1;
  request.num_computed_tokens = 0;
}

std::unique_ptr<RetainedSequence> MemoryOracle::retain(Request& request) {
  SE_CHECK(request.seq >= 0, "request {} holds no cache state to retain", request.request_id);
  std::unique_ptr<RetainedSequence> state = controller_.retain(request.seq);
  request.seq = -1;
  request.num_computed_tokens = 0;
  return state;
}

}  // namespace se
