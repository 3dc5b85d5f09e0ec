#include "kv/kv_store_kind.h"

namespace se {

Result<KvStoreKind> parse_kv_cache_dtype(std::string_view text) {
  if (text == "auto") return KvStoreKind::kExplicit;
  if (text == "fp8" || text == "fp8_e4m3") return KvStoreKind::kFp8E4M3;
  if (text == "kivi2") return KvStoreKind::kKivi2;
  if (text == "kivi4") return KvStoreKind::kKivi4;
  return invalid_argument("--kv-cache-dtype must be auto, fp8, fp8_e4m3, kivi2 or kivi4, got '{}'", text);
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
  }
  return "?";
}

int32_t kivi_bits(KvStoreKind store) {
  if (store == KvStoreKind::kKivi2) return 2;
  return store == KvStoreKind::kKivi4 ? 4 : 0;
}

DType kv_page_dtype(Device device, KvStoreKind store) {
  if (store == KvStoreKind::kFp8E4M3) return DType::kU8;
  return device == Device::kCuda ? DType::kBF16 : DType::kF32;
}

}  // namespace se
