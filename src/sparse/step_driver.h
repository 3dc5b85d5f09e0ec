// The one sequence of a step every driver of a SparseController runs (the engine's model runner, teacher forcing,
// prune scoring, and a method's transient pass): build the batch (clear_batch, append_sequence), then run_step:
// the method's prepare_step, the forward, the caller's use of the logits, the method's finish_step. A transient
// pass runs inside its step's finish_step, so it builds its batch here and runs only the forward. run_step takes
// the forward as a callable so the model runner can replay it as a CUDA graph; it adds no host work of its own.
// Free functions over caller-owned state; thread-compatible.
#pragma once

#include <cstdint>
#include <span>

#include "model/forward_batch.h"
#include "sparse/sparse_controller.h"

namespace se {

// Empties `batch`, keeping its capacity.
void clear_batch(ForwardBatch& batch);

// Appends `token_ids` of sequence `seq` at positions first_position, first_position + 1, ... as one slice of
// `batch`; `num_prefill_tokens` as SequenceSlice has it. When `logit_row`, the slice's last row joins the rows
// whose logits the forward returns. Returns the slice's first row.
int32_t append_sequence(ForwardBatch& batch, int32_t seq, std::span<const int32_t> token_ids, int32_t first_position,
                        int32_t num_prefill_tokens, bool logit_row);

// prepare_step, `forward()` (returns the logits), `use(logits)`, finish_step: the hooks around the forward in the
// engine's order, so a method sees the same step wherever it runs.
template <typename Forward, typename Use>
void run_step(SparseController& controller, const ForwardBatch& batch, Forward&& forward, Use&& use) {
  controller.prepare_step(batch);
  use(forward());
  controller.finish_step(batch);
}

}  // namespace se
