#include "sparse/step_driver.h"

namespace se {

void clear_batch(ForwardBatch& batch) {
  batch.token_ids.clear();
  batch.positions.clear();
  batch.sequences.clear();
  batch.logit_rows.clear();
}

int32_t append_sequence(ForwardBatch& batch, int32_t seq, std::span<const int32_t> token_ids, int32_t first_position,
                        int32_t num_prefill_tokens, bool logit_row) {
  const int32_t row = batch.num_tokens();
  const auto n = static_cast<int32_t>(token_ids.size());
  batch.sequences.push_back({seq, row, n, num_prefill_tokens});
  batch.token_ids.insert(batch.token_ids.end(), token_ids.begin(), token_ids.end());
  for (int32_t i = 0; i < n; ++i) batch.positions.push_back(first_position + i);
  if (logit_row) batch.logit_rows.push_back(row + n - 1);
  return row;
}

}  // namespace se
