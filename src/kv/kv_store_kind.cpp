#include "kv/kv_store_kind.h"

#include "backend/quant/quantized_kv_layout.h"

namespace se {

Result<KvStoreKind> parse_kv_cache_dtype(std::string_view text) {
  if (text == "auto") return KvStoreKind::kExplicit;
  if (text == "fp8" || text == "fp8_e4m3") return KvStoreKind::kFp8E4M3;
  return invalid_argument("--kv-cache-dtype must be auto, fp8 or fp8_e4m3, got '{}'", text);
}

std::string_view kv_store_kind_name(KvStoreKind store) { return store == KvStoreKind::kFp8E4M3 ? "fp8_e4m3" : "auto"; }

DType kv_page_dtype(Device device, KvStoreKind store) {
  if (store == KvStoreKind::kFp8E4M3) return DType::kU8;
  return device == Device::kCuda ? DType::kBF16 : DType::kF32;
}

size_t kv_store_bytes_per_token(Device device, KvStoreKind store, int32_t head_dim) {
  if (store == KvStoreKind::kFp8E4M3) return fp8_kv_bytes_per_token(head_dim);
  return 2 * static_cast<size_t>(head_dim) * dtype_size(kv_page_dtype(device, store));
}

}  // namespace se
