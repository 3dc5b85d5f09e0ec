#include "sparse/method_traits.h"

#include "backend/device_memory.h"
#include "backend/ops.h"

namespace se {

std::vector<std::string_view> method_ops(const MethodTraits& traits) {
  std::vector<std::string_view> ops;
  switch (traits.score_needs) {
    case ScoreNeeds::kNone: break;
    case ScoreNeeds::kObservationWindow:
    case ScoreNeeds::kColumnSums: ops.push_back("attention_scores"); break;
    case ScoreNeeds::kReconstruction: ops.push_back("subset_attention_max_scores"); break;
    case ScoreNeeds::kQueryKeyBounds:
      ops.insert(ops.end(), {"update_page_key_bounds", "select_pages_by_key_bounds"});
      break;
    case ScoreNeeds::kFilterLogits:
      ops.insert(ops.end(), {"top_keys_by_logits_max_over_heads", "token_lists_with_tail"});
      break;
  }
  if (traits.family == MethodFamily::kEviction) ops.insert(ops.end(), {"compact_kv", "move_kv_rows"});
  if (traits.family == MethodFamily::kDynamicSelection) ops.push_back("paged_attention over a selection");
  return ops;
}

Status check_runs_on(Device device, const MethodTraits& traits, std::string_view name) {
  if (device == Device::kCpu) return Status::ok();
  std::string missing;
  for (std::string_view op : method_ops(traits))
    if (!cuda_implements(op)) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", op);
  if (missing.empty()) return Status::ok();
  return unimplemented("sparse method '{}' cannot run on {}: no CUDA kernel yet for {}", name, device_name(device),
                       missing);
}

bool decode_forward_is_static(const MethodTraits& traits) {
  switch (traits.family) {
    case MethodFamily::kDense: return true;
    // Column-sum scores (H2O) accumulate every decode step; the other eviction scores come from the prompt.
    case MethodFamily::kEviction: return traits.score_needs != ScoreNeeds::kColumnSums;
    // Key-bound ranking (Quest) runs as ops over the device tables, its lists in the batch-wide layout that
    // attention reads by value.
    case MethodFamily::kDynamicSelection: return traits.score_needs == ScoreNeeds::kQueryKeyBounds;
    default: return false;
  }
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

std::string_view score_needs_name(ScoreNeeds needs) {
  switch (needs) {
    case ScoreNeeds::kNone: return "none";
    case ScoreNeeds::kObservationWindow: return "observation-window";
    case ScoreNeeds::kColumnSums: return "column-sums";
    case ScoreNeeds::kReconstruction: return "reconstruction";
    case ScoreNeeds::kQueryKeyBounds: return "query-key-bounds";
    case ScoreNeeds::kFilterLogits: return "filter-logits";
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
