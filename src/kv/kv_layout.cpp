#include "kv/kv_layout.h"

#include <algorithm>
#include <limits>

#include "backend/quant/quantized_kv_layout.h"
#include "backend/quant/turboquant_kv.h"

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
  if ((store == KvStoreKind::kFp8E4M3 || turboquant()) && dtype != DType::kU8) {
    return invalid_argument("kv layout: the {} store keeps u8 codes, got {}", kv_store_kind_name(store),
                            dtype_name(dtype));
  }
  if ((store == KvStoreKind::kExplicit || kivi() || one_row_per_token()) && dtype != DType::kF32 &&
      dtype != DType::kF16 && dtype != DType::kBF16) {
    return invalid_argument("kv layout: dtype must be f32, f16 or bf16, got {}", dtype_name(dtype));
  }
  if (kivi()) {
    const int32_t bits = kivi_bits(store);
    if (page_size % (32 / bits) != 0)
      return invalid_argument("kv layout: the KIVI group size {} is not a whole number of {}-bit code words", page_size,
                              bits);
    if (kivi_residual <= 0 || kivi_residual % page_size != 0)
      return invalid_argument("kv layout: the KIVI residual {} must be a positive multiple of the group size {}",
                              kivi_residual, page_size);
    if (kivi_max_step_tokens <= 0)
      return invalid_argument("kv layout: a KIVI store needs the most tokens of a step, got {}", kivi_max_step_tokens);
    if (kivi_value_group_size <= 0 || head_dim % kivi_value_group_size != 0)
      return invalid_argument("kv layout: the KIVI value group size {} does not divide head_dim {}",
                              kivi_value_group_size, head_dim);
  }
  if (turboquant() && turboquant_format(store).outlier_split && (head_dim < 4 || head_dim % 2 != 0))
    return invalid_argument(
        "kv layout: the {} store splits each head's channels in halves; head_dim {} is not even "
        "and at least 4",
        kv_store_kind_name(store), head_dim);
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
  if (kivi() && residual_page_tokens() < 1)
    return invalid_argument("kv layout: a KIVI page of {} bytes holds no {} residual row of head_dim {}", page_bytes(),
                            dtype_name(dtype), head_dim);
  return Status::ok();
}

size_t KvLayout::kivi_page_bytes() const {
  return kivi_page_layout(page_size, kivi_value_group_size, head_dim, kivi_bits(store)).page_bytes;
}

size_t KvLayout::turboquant_slot_bytes() const {
  return turboquant_slot_layout(head_dim, turboquant_format(store)).slot_bytes();
}

int32_t KvLayout::residual_page_tokens() const {
  return static_cast<int32_t>(kivi_page_bytes() / (2 * static_cast<size_t>(head_dim) * dtype_size(dtype)));
}

int64_t KvLayout::kivi_pages_per_stream(int64_t num_tokens) const {
  // A step from L to L + n <= num_tokens tokens holds the quantized pages of L + n and, until it flushes, a
  // window of min(L, R) + n <= min(num_tokens, R + n) tokens, starting anywhere in its first page.
  const int64_t quantized_keys = num_tokens / kivi_residual * kivi_residual;
  const int64_t full = std::min<int64_t>(num_tokens, int64_t{kivi_residual} + kivi_max_step_tokens);
  const int64_t per_page = residual_page_tokens();
  return quantized_keys / page_size + (full == 0 ? 0 : (full + 2 * (per_page - 1)) / per_page);
}

double KvLayout::bytes_per_token(int64_t num_tokens) const {
  const double row_bytes = 2.0 * head_dim * static_cast<double>(dtype_size(dtype));
  if (turboquant()) return static_cast<double>(turboquant_slot_bytes());
  if (!kivi()) return one_row_per_token() ? row_bytes / 2 : row_bytes;
  const int64_t quantized_pages = num_tokens / kivi_residual * kivi_residual / page_size;  // whole key groups
  const int64_t full = std::min<int64_t>(num_tokens, kivi_residual);
  return (static_cast<double>(quantized_pages) * static_cast<double>(kivi_page_bytes()) +
          static_cast<double>(full) * row_bytes) /
         static_cast<double>(num_tokens);
}

KvLayout make_kv_layout(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, int32_t page_size, Device device,
                        KvStoreKind store, int32_t kivi_group_size, int32_t kivi_residual, int32_t max_step_tokens) {
  KvLayout layout;
  layout.num_layers = num_layers;
  layout.num_kv_heads = num_kv_heads;
  layout.head_dim = head_dim;
  layout.page_size = page_size;
  layout.store = store;
  layout.dtype = kv_page_dtype(device, store);
  if (kivi_bits(store) != 0) {
    layout.page_size = kivi_group_size;
    layout.kivi_residual = kivi_residual;
    layout.kivi_value_group_size = std::min(kivi_group_size, head_dim);
    layout.kivi_max_step_tokens = max_step_tokens;
  }
  return layout;
}

Result<int32_t> num_pages_that_fit(const KvLayout& layout, size_t num_bytes) {
  SE_RETURN_IF_ERROR(layout.validate());
  const size_t pages = num_bytes / layout.page_bytes();
  const auto max_pages = static_cast<size_t>(std::numeric_limits<int32_t>::max());
  return static_cast<int32_t>(pages < max_pages ? pages : max_pages);
}

}  // namespace se
