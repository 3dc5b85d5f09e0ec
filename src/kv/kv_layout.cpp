#include "kv/kv_layout.h"

#include <limits>

namespace se {

Status KvLayout::validate() const {
  if (num_layers <= 0) {
    return invalid_argument("kv layout: num_layers must be positive, got {}", num_layers);
  }
  if (num_kv_heads <= 0) {
    return invalid_argument("kv layout: num_kv_heads must be positive, got {}", num_kv_heads);
  }
  if (head_dim <= 0) {
    return invalid_argument("kv layout: head_dim must be positive, got {}", head_dim);
  }
  if (page_size <= 0) {
    return invalid_argument("kv layout: page_size must be positive, got {}", page_size);
  }
  if (store == KvStoreKind::kFp8E4M3 && dtype != DType::kU8) {
    return invalid_argument("kv layout: the fp8 store keeps u8 codes, got {}", dtype_name(dtype));
  }
  if (store == KvStoreKind::kExplicit && dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return invalid_argument("kv layout: dtype must be f32, f16 or bf16, got {}", dtype_name(dtype));
  }
  const int64_t num_streams = static_cast<int64_t>(num_layers) * num_kv_heads;
  if (num_streams > std::numeric_limits<int32_t>::max()) {
    return invalid_argument("kv layout: {} layers x {} KV heads overflow int32", num_layers,
                            num_kv_heads);
  }
  // page_size * head_dim * 2 * 4 bytes at most: keep a page well inside 32 bits so offsets never
  // overflow.
  if (static_cast<int64_t>(page_size) * head_dim > (int64_t{1} << 28)) {
    return invalid_argument("kv layout: page of {} tokens x head_dim {} is too large", page_size,
                            head_dim);
  }
  return Status::ok();
}

Result<int32_t> num_pages_that_fit(const KvLayout& layout, size_t num_bytes) {
  SE_RETURN_IF_ERROR(layout.validate());
  const size_t pages = num_bytes / layout.page_bytes();
  const auto max_pages = static_cast<size_t>(std::numeric_limits<int32_t>::max());
  return static_cast<int32_t>(pages < max_pages ? pages : max_pages);
}

}  // namespace se
