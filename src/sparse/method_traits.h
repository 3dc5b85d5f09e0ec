// MethodTraits: what a sparse method declares about itself, so the engine can plan around it without ever
// naming it: its family, whether it keeps every token resident (and so can share the radix prefix cache), the
// attention scores it reads, how its state is reused across requests, and what it does during prefill.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tensor/tensor.h"

namespace se {

enum class MethodFamily : uint8_t { kDense, kDynamicSelection, kEviction, kQuantization, kCompression };

// Attention scores a method reads from its hooks (it computes them with backend ops::attention_scores).
enum class ScoreNeeds : uint8_t {
  kNone,
  kObservationWindow,  // the softmax of the last prompt queries (SnapKV family) at the end of prefill
  kColumnSums,         // every step's softmax summed over its queries (H2O)
  kReconstruction,     // scores of extra context-reconstruction passes (KVzip)
  kQueryKeyBounds,     // q against per-page key bounds, no softmax (Quest)
  kFilterLogits,       // raw q.k logits at filter layers (OmniKV)
};

// How a finished request's state can serve later ones.
enum class PrefixMode : uint8_t { kRadix, kChain };

// What the method does while a prompt is prefilled.
enum class PrefillPolicy : uint8_t {
  kDense,               // prefill attends densely; nothing changes
  kCompressAfter,       // dense prefill, then compression once the prompt is in (SnapKV, PyramidKV, ...)
  kEvictDuring,         // evicts as tokens arrive, prefill included (StreamingLLM, H2O)
};

struct MethodTraits {
  MethodFamily family = MethodFamily::kDense;
  bool keeps_full_history = true;  // every token stays resident: the radix prefix cache applies
  ScoreNeeds score_needs = ScoreNeeds::kNone;
  PrefixMode prefix_mode = PrefixMode::kRadix;
  PrefillPolicy prefill_policy = PrefillPolicy::kDense;
};

// The backend ops (backend/ops.h names) a method's hooks call on top of the dense forward (write_kv and
// paged_attention): the scoring op its score needs imply, compact_kv and move_kv_rows for eviction, and paged
// attention over a selection for dynamic selection. The engine checks them against the device before it starts.
std::vector<std::string_view> method_ops(const MethodTraits& traits);
// Ok when every op of method_ops(traits) has a kernel on `device`; else kUnimplemented naming method `name`, the
// device and the missing ops.
Status check_runs_on(Device device, const MethodTraits& traits, std::string_view name);

// Whether a decode step's forward enqueues the same device work every step: none of the method's work inside it
// (what it does at step boundaries, such as evicting in finish_step, does not count), or only ops whose launches
// depend on the batch shape alone and that read and write device buffers in place (Quest's ranking). The engine
// may then replay it as a CUDA graph.
bool decode_forward_is_static(const MethodTraits& traits);

std::string_view family_name(MethodFamily family);
std::string_view score_needs_name(ScoreNeeds needs);
std::string_view prefix_mode_name(PrefixMode mode);
std::string_view prefill_policy_name(PrefillPolicy policy);

}  // namespace se
