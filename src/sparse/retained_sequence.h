// RetainedSequence: what a finished turn leaves in the Chain Cache for its chain: the CacheManager's snapshot of
// the sequence (page references, per-stream lengths, the logical length) and the method's per-sequence metadata.
// SparseController::retain makes one and SparseController::resume opens a new sequence on it. Owning: it holds
// its pages until resumed or destroyed (on the engine thread, which owns the pool).
#pragma once

#include <memory>

#include "kv/chain_cache.h"
#include "sparse/cache_manager.h"
#include "sparse/method_runtime.h"

namespace se {

class RetainedSequence final : public ChainState {
 public:
  RetainedSequence(std::unique_ptr<SequenceSnapshot> kv, std::unique_ptr<MethodSequenceState> method)
      : kv_(std::move(kv)), method_(std::move(method)) {}

  int64_t num_held_pages() const override { return kv_->num_held_pages(); }
  int32_t num_logical_tokens() const override { return kv_->num_logical_tokens(); }
  Status offload() override { return kv_->offload(); }
  bool is_offloaded() const override { return kv_->is_offloaded(); }
  int64_t num_host_pages() const override { return kv_->num_host_pages(); }
  int64_t num_host_pages_short() const override { return kv_->num_host_pages_short(); }
  int64_t num_pages_to_restore() const override { return kv_->num_pages_to_restore(); }
  std::optional<int64_t> num_pages_to_extend(int64_t num_new_tokens) const override {
    return kv_->num_pages_to_extend(num_new_tokens);
  }
  SequenceSnapshot& kv() { return *kv_; }

  std::unique_ptr<SequenceSnapshot> take_kv() { return std::move(kv_); }
  std::unique_ptr<MethodSequenceState> take_method_state() { return std::move(method_); }

 private:
  std::unique_ptr<SequenceSnapshot> kv_;
  std::unique_ptr<MethodSequenceState> method_;  // null for methods whose state lives in the KV alone
};

}  // namespace se
