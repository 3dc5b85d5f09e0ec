#include "sparse/method_traits.h"

namespace se {

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
