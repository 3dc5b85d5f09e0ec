#include "sparse/method_traits.h"

#include <algorithm>
#include <optional>

#include "backend/device_memory.h"

namespace se {

Status check_runs_on(Device device, const MethodTraits& traits, std::string_view name) {
  if (device == Device::kCpu) return Status::ok();
  if (traits.host_hooks)
    return unimplemented("sparse method '{}' cannot run on {}: its hooks read the step's tensors in host memory", name,
                         device_name(device));
  std::string missing;
  for (OpId op : traits.ops)
    if (!cuda_implements(op)) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", op_name(op));
  if (missing.empty()) return Status::ok();
  return unimplemented("sparse method '{}' cannot run on {}: no CUDA kernel yet for {}", name, device_name(device),
                       missing);
}

Status check_latent_attention_runs_on(Device device, const MethodTraits& traits, std::string_view name) {
  if (device == Device::kCpu) return Status::ok();
  if (!keeps_shared_latent(traits))
    return unimplemented(
        "sparse method '{}' reads every head's expanded keys and values of a latent-attention model, which run on the "
        "CPU only; on {} the methods that keep the shared latent run (`sparse-engine methods`)",
        name, device_name(device));
  for (OpId op : traits.ops)
    if (op != OpId::kCompactKv && op != OpId::kMoveKvRows)
      return unimplemented(
          "sparse method '{}' cannot run over a latent-attention model's shared latent on {}: {} has no CUDA kernel "
          "for latent rows yet",
          name, device_name(device), op_name(op));
  return Status::ok();
}

namespace {
// The first of the method's ops that reads explicit K/V pages: any but eviction's row copies (which move a quantized
// store's codes or slots as bytes) and attention_scores (which decodes each stored key as it reads it).
std::optional<OpId> op_reading_explicit_pages(const MethodTraits& traits) {
  for (OpId op : traits.ops)
    if (op != OpId::kCompactKv && op != OpId::kMoveKvRows && op != OpId::kAttentionScores) return op;
  return std::nullopt;
}
// Query-aware page selection's ops, which bound decoded FP8 keys and KIVI groups and read a selection of their pages,
// on the CPU only.
bool selects_over_quantized_on_cpu(OpId op) {
  return op == OpId::kUpdatePageKeyBounds || op == OpId::kSelectPagesByKeyBounds ||
         op == OpId::kPagedAttentionOverSelection;
}
// Ok on the CPU; elsewhere the refusal of a method whose op reads the store's quantized `pages` on the CPU only.
Status check_reads_on_cpu(Device device, std::string_view store_name, std::string_view name, OpId op,
                          std::string_view pages) {
  if (device == Device::kCpu) return Status::ok();
  return invalid_argument(
      "--kv-cache-dtype {} cannot run sparse method '{}' on {}: its op {} reads {} on the CPU only (--device cpu, or "
      "--kv-cache-dtype auto)",
      store_name, name, device_name(device), op_name(op), pages);
}
}  // namespace

Status check_kv_store_supports(KvStoreKind store, Device device, const MethodTraits& traits, std::string_view name) {
  if (store == KvStoreKind::kExplicit) return Status::ok();
  const std::string_view store_name = kv_store_kind_name(store);
  // On CUDA a store runs where its attention has a kernel; the method's ops then follow the CPU's rules below (the
  // GPU's row copies and attention_scores read FP8 pages as the CPU's do).
  const OpId attention = kivi_bits(store) != 0  ? OpId::kPagedAttentionOverKiviPages
                         : is_turboquant(store) ? OpId::kPagedAttentionOverTurboQuantPages
                                                : OpId::kPagedAttentionOverFp8Pages;
  if (device == Device::kCuda && !cuda_implements(attention))
    return unimplemented(
        "--kv-cache-dtype {}: no CUDA kernel reads or writes these quantized KV pages yet ({} is CPU only); use "
        "--device cpu or --kv-cache-dtype auto",
        store_name, op_name(attention));
  // A KIVI stream is quantized groups plus a full-precision window. The store holds a compress-after method's
  // prompt in the window until the method has scored it (attention_scores reads the window's rows) and evicted
  // from it (the store moves the kept rows itself), and drops a sealed group as a page, moving no byte; on the CPU
  // attention_scores reads the quantized groups too, and the page key bounds, their ranking and attention over a
  // selection read whole groups; no other method op reads or moves KIVI groups.
  if (kivi_bits(store) != 0 && !traits.ops.empty()) {
    if (traits.evicts_sealed_groups) {
      // Its scores read the quantized groups, which attention_scores decodes on the CPU only.
      const bool scores = std::find(traits.ops.begin(), traits.ops.end(), OpId::kAttentionScores) != traits.ops.end();
      if (!scores) return Status::ok();
      return check_reads_on_cpu(device, store_name, name, OpId::kAttentionScores, "KIVI's quantized groups");
    }
    // A page selection over KIVI takes whole key groups (a page is a group; the window's keys are read as they are),
    // and the method keeps every token.
    if (traits.keeps_full_history && std::all_of(traits.ops.begin(), traits.ops.end(), selects_over_quantized_on_cpu))
      return check_reads_on_cpu(device, store_name, name, traits.ops.front(), "these quantized pages");
    if (traits.prefill_policy != PrefillPolicy::kCompressAfter)
      return invalid_argument(
          "--kv-cache-dtype {} cannot run sparse method '{}': it evicts or selects single tokens as decode runs, and "
          "KIVI quantizes keys per channel over groups of tokens sharing one scale and minimum as its residual window "
          "slides, so a token inside a quantized group can be neither dropped nor read alone (only methods without "
          "ops of their own, compress-after methods, which compress the prompt before it is quantized, methods "
          "that drop whole quantized groups and, on the CPU, page selection by key bounds, which reads whole groups, "
          "run over it; `sparse-engine methods` lists them)",
          store_name, name);
    if (const std::optional<OpId> op = op_reading_explicit_pages(traits))
      return invalid_argument(
          "--kv-cache-dtype {} cannot run sparse method '{}': its op {} reads explicit K/V pages only (over KIVI a "
          "compress-after method may score with attention_scores and evict)",
          store_name, name, op_name(*op));
    return Status::ok();
  }
  // TurboQuant slots move whole and attention_scores reads their keys; no page-bound op reads them yet. Page selection
  // over FP8 pages, as over KIVI, is for a method that keeps every token.
  for (OpId op : traits.ops) {
    if (op == OpId::kCompactKv || op == OpId::kMoveKvRows || op == OpId::kAttentionScores) continue;
    if (is_turboquant(store) || !selects_over_quantized_on_cpu(op) || !traits.keeps_full_history)
      return invalid_argument(
          "--kv-cache-dtype {} cannot run sparse method '{}': its op {} reads explicit K/V pages only (with this "
          "store a method may call attention_scores, compact_kv and move_kv_rows{})",
          store_name, name, op_name(op),
          is_turboquant(store) ? "" : ", and on the CPU rank and attend over pages by their key bounds");
    SE_RETURN_IF_ERROR(check_reads_on_cpu(device, store_name, name, op, "these quantized pages"));
  }
  return Status::ok();
}

Status check_method_runs(Device device, KvStoreKind store, const MethodTraits& traits, std::string_view name) {
  SE_RETURN_IF_ERROR(check_runs_on(device, traits, name));
  return check_kv_store_supports(store, device, traits, name);
}

Status check_tensor_parallel(const MethodTraits& traits, std::string_view name) {
  if (traits.tensor_parallel) return Status::ok();
  return unimplemented(
      "{} does not run under tensor parallelism yet (its decisions span KV heads the ranks split); run it with "
      "--tensor-parallel-size 1",
      name);
}

Result<KvStoreKind> model_kv_store(KvStoreKind requested, bool latent_attention, const MethodTraits& traits) {
  if (!latent_attention || !keeps_shared_latent(traits)) return requested;
  if (requested != KvStoreKind::kExplicit)
    return unimplemented("the {} KV store does not hold shared latent rows yet (--kv-cache-dtype auto)",
                         kv_store_kind_name(requested));
  return KvStoreKind::kSharedLatent;
}

std::string_view family_name(MethodFamily family) {
  switch (family) {
    case MethodFamily::kDense: return "dense";
    case MethodFamily::kDynamicSelection: return "dynamic-selection";
    case MethodFamily::kEviction: return "eviction";
    case MethodFamily::kQuantization: return "quantization";
    case MethodFamily::kCompression: return "compression";
  }
  return "?";
}

std::string_view prefix_mode_name(PrefixMode mode) { return mode == PrefixMode::kRadix ? "radix" : "chain"; }

std::string_view prefill_policy_name(PrefillPolicy policy) {
  switch (policy) {
    case PrefillPolicy::kDense: return "dense";
    case PrefillPolicy::kCompressAfter: return "compress-after";
    case PrefillPolicy::kEvictDuring: return "evict-during";
  }
  return "?";
}

}  // namespace se
