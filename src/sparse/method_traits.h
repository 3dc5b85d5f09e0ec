// MethodTraits: what a sparse method declares about itself, so the engine can plan around it without ever
// naming it: its family, whether it keeps every token resident (and so can share the radix prefix cache), the
// backend ops its hooks call, whether its decode forward can replay as a CUDA graph, how its state is reused
// across requests, and what it does during prefill. Each method fills its own traits in its constructor.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "backend/attention_view.h"
#include "backend/op_id.h"
#include "base/status.h"
#include "kv/kv_store_kind.h"
#include "tensor/tensor.h"

namespace se {

enum class MethodFamily : uint8_t { kDense, kDynamicSelection, kEviction, kQuantization, kCompression };

// How a finished request's state can serve later ones.
enum class PrefixMode : uint8_t { kRadix, kChain };

// What the method does while a prompt is prefilled.
enum class PrefillPolicy : uint8_t {
  kDense,               // prefill attends densely; nothing changes
  kCompressAfter,       // dense prefill, then compression once the prompt is in
  kEvictDuring,         // evicts as tokens arrive, prefill included
};

struct MethodTraits {
  MethodFamily family = MethodFamily::kDense;
  bool keeps_full_history = true;  // every token stays resident: the radix prefix cache applies
  // The backend ops its hooks call on top of the dense forward (write_kv and paged_attention): the scoring ops,
  // compact_kv and move_kv_rows for eviction, paged attention over a selection for dynamic selection. The engine
  // checks them against the device before it starts.
  std::vector<OpId> ops;
  // Whether a decode step's forward enqueues the same device work every step: none of the method's work inside it
  // (what it does at step boundaries, such as evicting in finish_step, does not count), or only ops whose
  // launches depend on the batch shape alone and that read and write device buffers in place (a ranking over
  // device tables). The engine may then replay it as a CUDA graph.
  bool static_decode_forward = false;
  // The unit build_*_selection hands out (token or page indices).
  SelectionUnit selection_unit = SelectionUnit::kToken;
  PrefixMode prefix_mode = PrefixMode::kRadix;
  PrefillPolicy prefill_policy = PrefillPolicy::kDense;
  // Whether its hooks read the step's tensors in host memory (the CPU backend only), whatever kernels its ops have.
  bool host_hooks = false;
  // Whether its choices depend on token positions alone, never on keys, values or scores: it then runs over a
  // latent-attention (MLA) model's shared latent store as it does over per-head K/V.
  bool position_only = false;
  // Whether it reads keys only through the logits q . k (attention scores, bounds on them), never values, outputs
  // or a key's own channels apart from such bounds: over a latent-attention model's shared latent it is handed the
  // absorbed queries and the latent rows as q and k, whose products are those logits, and runs unchanged.
  bool keys_through_logits = false;
  // Whether it runs on tensor-parallel ranks that each hold some of the KV heads (model/tensor_parallel.h), every
  // rank with an instance of its own: its choices for a KV head read only that head and its query heads, or, where
  // they span the heads of a layer, it joins the ranks' inputs over its communicator
  // (MethodRuntime::set_communicator) so every rank decides alike. Methods without it refuse more than one rank.
  bool tensor_parallel = false;
  // Whether, over a store that quantizes tokens in groups (KIVI), it evicts only whole sealed groups
  // (KvStreams::sealed_groups), which the store drops as pages without running any op: it then runs over that
  // store as decode goes on.
  bool evicts_sealed_groups = false;
};

// Whether a method keeps a latent-attention (MLA) model's shared latent, one row per token for all heads
// (KvStoreKind::kSharedLatent), rather than every head's expanded K/V: methods whose choices read positions alone or
// keys through logits alone do; the others read per-head keys, values or outputs, which only the expanded store has.
inline bool keeps_shared_latent(const MethodTraits& traits) {
  return traits.position_only || traits.keys_through_logits;
}

// The store a model's KV is kept in: kSharedLatent for a latent-attention model whose method keeps the shared latent
// (keeps_shared_latent), else `requested` (the --kv-cache-dtype store). A quantized store over the shared latent is
// kUnimplemented: no quantized store holds latent rows yet.
Result<KvStoreKind> model_kv_store(KvStoreKind requested, bool latent_attention, const MethodTraits& traits);

// Ok when the method runs over a latent-attention (MLA) model on `device`: anywhere on the CPU; on CUDA only over the
// shared latent (the expanded heads run on the CPU alone) and with ops whose CUDA kernels take the latent rows:
// eviction's row copies, which move rows as bytes (the GPU's scores, page bounds and selection read 64, 128 or 256-wide
// keys, not rows of kv_lora_rank + qk_rope). Else kUnimplemented naming method `name`, the device and what is missing.
Status check_latent_attention_runs_on(Device device, const MethodTraits& traits, std::string_view name);

// Ok when every op of traits.ops has a kernel on `device` and its hooks do not need host memory; else
// kUnimplemented naming method `name`, the device and the missing ops (or its host hooks).
Status check_runs_on(Device device, const MethodTraits& traits, std::string_view name);

// Ok when the method can keep its KV in `store` on `device`: the explicit store always; a quantized store where
// its attention has a kernel (kUnimplemented on CUDA otherwise), and only for methods whose ops all read it:
// eviction's row copies and attention_scores do, page bounds and selection do not (kInvalidArgument naming the op);
// a TurboQuant store only for methods with no ops of their own; a KIVI store for those, the compress-after methods
// that score and evict the prompt before it is quantized, and the methods that evict sealed groups.
Status check_kv_store_supports(KvStoreKind store, Device device, const MethodTraits& traits, std::string_view name);

// check_runs_on, then check_kv_store_supports: what building a method's cache on `device` in `store` needs (the
// engine, teacher forcing, and the CLI before the model loads).
Status check_method_runs(Device device, KvStoreKind store, const MethodTraits& traits, std::string_view name);

// Ok when the method can decide on a rank's share of the KV heads (traits.tensor_parallel); else kUnimplemented.
Status check_tensor_parallel(const MethodTraits& traits, std::string_view name);

std::string_view family_name(MethodFamily family);
std::string_view prefix_mode_name(PrefixMode mode);
std::string_view prefill_policy_name(PrefillPolicy policy);

}  // namespace se
