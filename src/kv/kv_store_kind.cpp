#include "kv/kv_store_kind.h"

#include "backend/quant/turboquant_kv.h"
#include "base/check.h"

namespace se {

Result<KvStoreKind> parse_kv_cache_dtype(std::string_view text) {
  if (text == "fp8") return KvStoreKind::kFp8E4M3;
  for (KvStoreKind store : kKvStoreKinds)
    if (text == kv_store_kind_name(store)) return store;
  return invalid_argument(
      "--kv-cache-dtype must be auto, fp8, fp8_e4m3, kivi2, kivi4, turboquant_k8v4, turboquant_4bit_nc, "
      "turboquant_k3v4_nc, turboquant_3bit_nc, turboquant_2.5 or turboquant_3.5, got '{}'",
      text);
}

std::string_view kv_store_kind_name(KvStoreKind store) {
  switch (store) {
    case KvStoreKind::kExplicit:
      return "auto";
    case KvStoreKind::kFp8E4M3:
      return "fp8_e4m3";
    case KvStoreKind::kKivi2:
      return "kivi2";
    case KvStoreKind::kKivi4:
      return "kivi4";
    case KvStoreKind::kSharedLatent:
      return "shared_latent";
    case KvStoreKind::kLowRankLatent:
      return "low_rank_latent";
    case KvStoreKind::kTurboQuantK8V4:
      return "turboquant_k8v4";
    case KvStoreKind::kTurboQuant4BitNc:
      return "turboquant_4bit_nc";
    case KvStoreKind::kTurboQuantK3V4Nc:
      return "turboquant_k3v4_nc";
    case KvStoreKind::kTurboQuant3BitNc:
      return "turboquant_3bit_nc";
    case KvStoreKind::kTurboQuantProd25:
      return "turboquant_2.5";
    case KvStoreKind::kTurboQuantProd35:
      return "turboquant_3.5";
  }
  return "?";
}

int32_t kivi_bits(KvStoreKind store) {
  if (store == KvStoreKind::kKivi2) return 2;
  return store == KvStoreKind::kKivi4 ? 4 : 0;
}

bool is_turboquant(KvStoreKind store) {
  return store == KvStoreKind::kTurboQuantK8V4 || store == KvStoreKind::kTurboQuant4BitNc ||
         store == KvStoreKind::kTurboQuantK3V4Nc || store == KvStoreKind::kTurboQuant3BitNc ||
         store == KvStoreKind::kTurboQuantProd25 || store == KvStoreKind::kTurboQuantProd35;
}

TurboQuantKvFormat turboquant_format(KvStoreKind store) {
  switch (store) {
    case KvStoreKind::kTurboQuantK8V4:
      return {8, 4, false};
    case KvStoreKind::kTurboQuant4BitNc:
      return {4, 4, true};
    case KvStoreKind::kTurboQuantK3V4Nc:
      return {3, 4, true};
    case KvStoreKind::kTurboQuant3BitNc:
      return {3, 3, true};
    case KvStoreKind::kTurboQuantProd25:
      return {2, 2, false, true};
    case KvStoreKind::kTurboQuantProd35:
      return {3, 3, false, true};
    default:
      SE_CHECK(false, "{} is not a TurboQuant store", kv_store_kind_name(store));
  }
  return {};
}

DType kv_page_dtype(Device device, KvStoreKind store) {
  if (store == KvStoreKind::kFp8E4M3 || is_turboquant(store)) return DType::kU8;
  return device == Device::kCuda ? DType::kBF16 : DType::kF32;
}

}  // namespace se
