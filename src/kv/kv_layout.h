// KvLayout: the shape of the paged KV cache, shared by the pool, page tables and prefix caches.
// Plain data. A page holds `page_size` tokens of K and V for ONE KV head of ONE layer, laid out
// [2 (K, V)][page_size][head_dim] contiguously, of `dtype` elements (one-byte codes for the FP8 store,
// kv_store_kind.h). A (layer, KV head) pair is a "stream"; streams are numbered layer * num_kv_heads + head.
// A shared-latent layout (multi-head latent attention) stores one row per token for all heads: num_kv_heads = 1,
// head_dim = the latent width, and a page holds only the K half, [page_size][head_dim] (the backend's
// KvPayload::kSharedLatent); the pool, page tables and prefix caches need nothing else.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "kv/kv_store_kind.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace se {

inline constexpr int32_t kDefaultPageSize = 16;

struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t page_size = kDefaultPageSize;  // tokens per page
  DType dtype = DType::kBF16;            // element type of K and V: kv_page_dtype(device, store)
  KvStoreKind store = KvStoreKind::kExplicit;
  bool shared_latent = false;  // pages hold one latent row per token and no V half

  // Ok when every field is positive, dtype is a float type (kU8 for the FP8 store), and a page and the
  // stream count fit their types.
  Status validate() const;

  int32_t num_streams() const { return num_layers * num_kv_heads; }
  int32_t stream(int32_t layer, int32_t head) const { return layer * num_kv_heads + head; }
  // Bytes of one page: 2 * page_size * head_dim elements (page_size * head_dim for a shared latent).
  size_t page_bytes() const {
    return (shared_latent ? 1 : 2) * static_cast<size_t>(page_size) * static_cast<size_t>(head_dim) * dtype_size(dtype);
  }
  // Element offset of token `offset` (< page_size) of K (kv = 0) or V (kv = 1) inside a page.
  size_t element_offset(int kv, int32_t offset) const {
    return (static_cast<size_t>(kv) * static_cast<size_t>(page_size) +
            static_cast<size_t>(offset)) *
           static_cast<size_t>(head_dim);
  }
  // Pages one stream needs for `num_tokens` tokens.
  int64_t pages_per_stream(int64_t num_tokens) const {
    return (num_tokens + page_size - 1) / page_size;
  }
  // Pages a lockstep sequence of `num_tokens` tokens needs over all streams.
  int64_t pages_for_tokens(int64_t num_tokens) const {
    return num_streams() * pages_per_stream(num_tokens);
  }
};

// Pages of `layout` that fit in `num_bytes` (capped at INT32_MAX since page ids are int32); an
// invalid layout is reported as an error naming the bad field.
Result<int32_t> num_pages_that_fit(const KvLayout& layout, size_t num_bytes);

}  // namespace se
