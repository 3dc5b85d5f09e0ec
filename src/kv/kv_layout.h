// KvLayout: the shape of the paged KV cache, shared by the pool, page tables and prefix caches.
// Plain data. A page holds `page_size` tokens of K and V for ONE KV head of ONE layer, laid out
// [2 (K, V)][page_size][head_dim] contiguously, of `dtype` elements (one-byte codes for the FP8 store,
// kv_store_kind.h). A (layer, KV head) pair is a "stream"; streams are numbered layer * num_kv_heads + head.
// A shared-latent store (KvStoreKind::kSharedLatent, multi-head latent attention) keeps one row per token for all
// heads: num_kv_heads = 1,
// head_dim = the latent width, and a page holds only the K half, [page_size][head_dim] (the backend's
// KvPayload::kSharedLatent); the pool, page tables and prefix caches need nothing else.
// A low-rank latent store (KvStoreKind::kLowRankLatent) is laid out alike: a stream is one (layer, head
// group), head_dim = the group's key rank plus its value rank, one [page_size][head_dim] half per page.
// A KIVI store (kv_store_kind.h) keeps ONE pool whose page is a quantized page of `page_size` (= the key group
// size) tokens (attention_view.h, kKivi); its full-precision residual window lives in pages of the same pool,
// each holding residual_page_tokens() explicit rows of `dtype` in the [2][tokens][head_dim] layout. One page size
// in bytes, so the pool, its free counts and the MemoryOracle's page arithmetic stay those of every other store.
// A TurboQuant store's page holds `page_size` slots of one stream, each a token's key and value records
// (attention_view.h, kTurboQuant), in bytes (dtype kU8); element_offset does not apply to it.
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
  // KIVI stores only: R, the residual window (a multiple of page_size), the channels per value group (a
  // divisor of head_dim), and the most tokens one step appends to a sequence (the engine's
  // max_num_batched_tokens): a step holds them in the window beside its R tokens until the step flushes.
  int32_t kivi_residual = 0;
  int32_t kivi_value_group_size = 0;
  int32_t kivi_max_step_tokens = 0;

  // Ok when every field is positive, dtype is a float type (kU8 for the FP8 store), and a page and the
  // stream count fit their types; for KIVI, page_size is a whole number of code words, R a multiple of it and
  // a residual page holds at least one token.
  Status validate() const;
  bool kivi() const { return store == KvStoreKind::kKivi2 || store == KvStoreKind::kKivi4; }
  // Pages hold one latent row per token and no V half.
  bool shared_latent() const { return store == KvStoreKind::kSharedLatent; }
  bool low_rank_latent() const { return store == KvStoreKind::kLowRankLatent; }
  // A page holds one row per token (a shared or low-rank latent), no V half.
  bool one_row_per_token() const { return shared_latent() || low_rank_latent(); }
  bool turboquant() const { return is_turboquant(store); }

  int32_t num_streams() const { return num_layers * num_kv_heads; }
  int32_t stream(int32_t layer, int32_t head) const { return layer * num_kv_heads + head; }
  // Bytes of one page: 2 * page_size * head_dim elements (page_size * head_dim for one row per token).
  // A KIVI page: kivi_page_layout(page_size, kivi_value_group_size, head_dim, bits).page_bytes; a TurboQuant page:
  // page_size slots.
  size_t page_bytes() const {
    if (kivi()) return kivi_page_bytes();
    if (turboquant()) return static_cast<size_t>(page_size) * turboquant_slot_bytes();
    return (one_row_per_token() ? 1 : 2) * static_cast<size_t>(page_size) * static_cast<size_t>(head_dim) *
           dtype_size(dtype);
  }
  // KIVI: the explicit rows one pool page holds as a residual page.
  int32_t residual_page_tokens() const;
  // Element offset of token `offset` (< page_size) of K (kv = 0) or V (kv = 1) inside a page.
  size_t element_offset(int kv, int32_t offset) const {
    return (static_cast<size_t>(kv) * static_cast<size_t>(page_size) +
            static_cast<size_t>(offset)) *
           static_cast<size_t>(head_dim);
  }
  // Pages one stream needs for `num_tokens` tokens (KIVI: the most it holds on the way there, its quantized pages
  // and its window at its fullest, R tokens plus one step's, kivi_residual_window.h).
  int64_t pages_per_stream(int64_t num_tokens) const {
    if (kivi()) return kivi_pages_per_stream(num_tokens);
    return (num_tokens + page_size - 1) / page_size;
  }
  // The bytes attention reads per token of a stream of `num_tokens` tokens (> 0): K and V of head_dim elements
  // each; KIVI: its quantized tokens' codes and parameters and its residual's explicit rows, averaged;
  // TurboQuant: one slot.
  double bytes_per_token(int64_t num_tokens) const;
  // Pages a lockstep sequence of `num_tokens` tokens needs over all streams.
  int64_t pages_for_tokens(int64_t num_tokens) const {
    return num_streams() * pages_per_stream(num_tokens);
  }

 private:
  size_t kivi_page_bytes() const;
  size_t turboquant_slot_bytes() const;
  int64_t kivi_pages_per_stream(int64_t num_tokens) const;
};

// The layout of `store` on `device` for a model's KV shape, pages of `page_size` tokens; a KIVI store's page is
// instead one key group of `kivi_group_size` tokens, its window `kivi_residual` tokens and its value groups
// min(kivi_group_size, head_dim) channels (KIVI groups values by the group size too; a head narrower than a group
// is one group), a step appending at most `max_step_tokens`. Not validated.
KvLayout make_kv_layout(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, int32_t page_size, Device device,
                        KvStoreKind store, int32_t kivi_group_size, int32_t kivi_residual, int32_t max_step_tokens);

// Pages of `layout` that fit in `num_bytes` (capped at INT32_MAX since page ids are int32); an
// invalid layout is reported as an error naming the bad field.
Result<int32_t> num_pages_that_fit(const KvLayout& layout, size_t num_bytes);

}  // namespace se
