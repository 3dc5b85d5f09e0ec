// ForwardBatch: the plain host-side description of one model forward. Tokens of several sequences are
// packed back to back; each sequence's slice is contiguous. Built by the caller (generator or scheduler).
#pragma once

#include <cstdint>
#include <vector>

namespace se {

struct SequenceSlice {
  int32_t seq = 0;          // the caller's handle for the sequence's KV state
  int32_t token_begin = 0;  // first row of this sequence in the batch
  int32_t num_tokens = 0;
  // Tokens the sequence prefills before it decodes: its prompt, plus any outputs it recomputes after a
  // preemption (0 = not tracked, as on the reference path).
  int32_t num_prefill_tokens = 0;

  // A slice whose tokens all lie past the prefill is a decode step.
  bool is_decode(const std::vector<int32_t>& positions) const {
    return num_prefill_tokens > 0 && positions[static_cast<size_t>(token_begin)] >= num_prefill_tokens;
  }
  // True for the prefill chunk that computes the last prefill token.
  bool completes_prefill(const std::vector<int32_t>& positions) const {
    const int32_t end = positions[static_cast<size_t>(token_begin)] + num_tokens;
    return num_prefill_tokens > 0 && !is_decode(positions) && end >= num_prefill_tokens;
  }
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;  // [num_tokens]
  std::vector<int32_t> positions;  // [num_tokens] absolute (logical) positions, RoPE uses these
  std::vector<SequenceSlice> sequences;
  std::vector<int32_t> logit_rows;  // batch rows whose logits the forward returns, in this order

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
};

}  // namespace se
