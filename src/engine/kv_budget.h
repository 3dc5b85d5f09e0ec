// KvBudget: how one rank's KV memory budget (--kv-cache-memory, or the share --gpu-memory-utilization gives, or the
// CPU default) splits between the page pool and what the method keeps per running sequence beside it
// (MethodRuntime::sequence_device_bytes: the decode-time compressors' recent query rows). Every sequence that may
// run at once gets its state out of the same budget as the pages, so a full batch never allocates past it:
// --max-num-seqs sequences when the budget holds their state and still leaves the pool room for one request of
// --max-model-len, fewer otherwise (the scheduler then queues the rest). Pure.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/status.h"

namespace se {

struct KvBudget {
  int64_t budget_bytes = 0;    // pages and per-sequence state together
  int64_t page_bytes = 0;      // one pool page with the method's metadata for it
  int64_t sequence_bytes = 0;  // the method's state per running sequence outside the pool (0: none)
  int64_t request_pages = 0;   // pages one request of max_model_len tokens holds at its peak
  int32_t max_model_len = 0;   // (for messages)
  int max_num_seqs = 1;        // sequences asked to run at once
};

struct KvBudgetSplit {
  int64_t num_pages = 0;  // the pool's pages
  int max_num_seqs = 0;   // sequences that run at once: the asked number, or fewer whose state the budget holds
};

// The split of `budget`. A method that keeps no per-sequence state gets every byte as pages and the asked
// concurrency. Otherwise kResourceExhausted, naming `method` and what is short, when the budget cannot hold one
// sequence's state beside the pages of one max_model_len request.
Result<KvBudgetSplit> split_kv_budget(const KvBudget& budget, std::string_view method);

}  // namespace se
