#include "engine/kv_budget.h"

#include <algorithm>

namespace se {

Result<KvBudgetSplit> split_kv_budget(const KvBudget& budget, std::string_view method) {
  if (budget.sequence_bytes <= 0) return KvBudgetSplit{budget.budget_bytes / budget.page_bytes, budget.max_num_seqs};
  // The pool keeps room for the longest request the engine takes; the rest holds sequences' state.
  const int64_t request_bytes = budget.request_pages * budget.page_bytes;
  const int64_t num_fitting =
      budget.budget_bytes > request_bytes ? (budget.budget_bytes - request_bytes) / budget.sequence_bytes : 0;
  if (num_fitting < 1)
    return resource_exhausted(
        "the KV cache budget of {} bytes cannot hold the {} bytes {} keeps per running sequence beside the {} bytes "
        "of pages one request of --max-model-len {} tokens needs; raise --kv-cache-memory (or "
        "--gpu-memory-utilization) or lower --max-model-len",
        budget.budget_bytes, budget.sequence_bytes, method, request_bytes, budget.max_model_len);
  const int max_num_seqs = static_cast<int>(std::min<int64_t>(budget.max_num_seqs, num_fitting));
  return KvBudgetSplit{(budget.budget_bytes - max_num_seqs * budget.sequence_bytes) / budget.page_bytes, max_num_seqs};
}

}  // namespace se
