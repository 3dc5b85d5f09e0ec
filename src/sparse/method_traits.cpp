#include "sparse/method_traits.h"

#include "backend/device_memory.h"

namespace se {

Status check_runs_on(Device device, const MethodTraits& traits, std::string_view name) {
  if (device == Device::kCpu) return Status::ok();
  std::string missing;
  for (OpId op : traits.ops)
    if (!cuda_implements(op)) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", op_name(op));
  if (missing.empty()) return Status::ok();
  return unimplemented("sparse method '{}' cannot run on {}: no CUDA kernel yet for {}", name, device_name(device),
                       missing);
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
