// AttentionView: the plain, non-owning description of what attention reads for one layer of one step, filled
// by a cache manager and consumed by the paged-attention kernels (taken by value). All pointers live on the
// device the kernel runs on; nothing here owns memory. Valid until the cache is next mutated.
//
// KV storage: page p starts at kv_base + p * page_bytes and holds [2 (K, V)][page_size][head_dim] elements of
// one KV head of one layer. Sequence s has its query rows q_indptr[s] .. q_indptr[s+1] and, per KV head h, a
// page list seqs[s].page_ids + h * seqs[s].stride with seqs[s].num_tokens[h] tokens stored in physical order.
//
// Causality is physical: the n new tokens of a sequence are the last n of each stream, so query row r of the
// sequence (0-based) sees keys [0, num_tokens - n + r] (and with a sliding window W only the last W of those).
// This stays right after eviction compacts older tokens, because new tokens are always appended at the end.
//
// Selection (dynamic sparse methods): a sequence may restrict what each KV head exposes to a sorted list of
// token indices or page indices (into that head's page list). Attention then reads the selected entries that
// are also causally visible; a null list means every visible token. An op that ranks every sequence at once
// writes its lists in one batch-wide layout (ProducedSelection), which a device view carries by value, so a
// step whose kernels read it copies no per-sequence views (what lets a CUDA graph replay it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace se {

class TurboQuantProdKvCodec;  // backend/quant/turboquant_prod_kv.h

enum class SelectionUnit : uint8_t { kToken, kPage };

// What the pages hold. Dense, selection and eviction methods keep explicit K/V. The quantization family keeps
// integer codes (plus, for KIVI, a full-precision residual window), the compression family keeps low-rank
// latents that attention expands back; their CacheManagers describe those stores with the views below.
// paged_attention reads kExplicit and kQuantized; the other ops accept kExplicit only.
//
// kSharedLatent (multi-head latent attention, DeepSeek-V2): each token stores one row of head_dim = kv_lora_rank +
// qk_rope_head_dim, the normed KV latent c then the rotated RoPE key, shared by every query head, so the view has
// num_kv_heads = 1. Page p starts at kv_base + p * page_bytes and holds [page_size][head_dim] (the K half of the
// explicit layout, no V half: the latent stands for both); element(page, 0, offset) reads it. Page lists, token
// counts, causality and selection are those of explicit pages. paged_latent_attention reads it and eviction's row
// copies move its rows (on both devices); on the CPU so do the ops that read K rows alone (attention_scores, the page
// key bounds and their ranking), which see the rows as the keys of one KV head.
enum class KvPayload : uint8_t { kExplicit, kQuantized, kLowRankLatent, kSharedLatent };

struct SeqKvView {
  const int32_t* page_ids = nullptr;    // [num_kv_heads][stride] for this layer
  int32_t stride = 0;                   // entries between the page lists of consecutive heads
  const int32_t* num_tokens = nullptr;  // [num_kv_heads] tokens stored per head
  const int32_t* selected = nullptr;    // [num_kv_heads][selected_stride] ascending indices, or null = all
  int32_t selected_stride = 0;
  const int32_t* num_selected = nullptr;  // [num_kv_heads]
};

// kQuantized: the pages hold integer codes; `quantized.scheme` says which layout (byte counts in
// backend/quant/quantized_kv_layout.h, which the cache's pool sizing and memory admission use).
//
// kFp8E4M3 (vLLM's `--kv-cache-dtype fp8`): the explicit layout, one byte per element. Page p starts at
// kv_base + p * page_bytes and holds the e4m3 codes [2 (K, V)][page_size][head_dim] of one KV head of one layer
// (page_bytes = 2 * page_size * head_dim); kv_dtype is kU8. Element x reads back as fp8_to_f32(code) * scale,
// with the layer's fp32 scales per KV head in `k_scales` / `v_scales` (a per-tensor scale is repeated over the
// heads). Page lists, token counts, causality and selection are exactly those of explicit pages.
//
// kKivi (jy-yuan/KIVI; `bits` = 2, 4 or 8): a stream holds num_tokens[h] tokens; keys [0, num_quantized_keys)
// and values [0, num_quantized_values) are quantized, the rest stay full precision (the residual window of
// kv/kivi_residual_window.h: keys flush R tokens at a time, values one at a time once more than R are held, so
// num_quantized_values <= num_quantized_keys, both <= num_tokens).
//   Quantized pages hold `group_size` tokens each, one key group per channel: the keys are always quantized in
//   whole R-token blocks with R a multiple of group_size, so a quantized page's keys are complete when they are
//   written and no group ever straddles two pages, whatever the explicit page size is. Values are quantized per
//   token, so they fill the same pages' value rows one token at a time as they leave the window. Token j's
//   quantized page is seqs[s].page_ids[h * stride + j / group_size], slot j % group_size; that page starts at
//   quantized_base + page_id * quantized_page_bytes and holds, in this order (G = group_size, D = head_dim,
//   W(n) = ceil(n * bits / 32) uint32 words packing n codes lowest bits first, as KIVI's pack does):
//     key codes     uint32 [D][W(G)]         channel c's G codes, token order
//     value codes   uint32 [G][W(D)]         token t's D codes, channel order
//     key scale     fp16   [D]               key minimum fp16 [D]
//     value scale   fp16   [G][D / value_group_size]   value minimum fp16 [G][D / value_group_size]
//   scale and minimum are fp16 bit patterns, as KIVI keeps them; x = fp16(fp16(code * scale) + minimum).
//   The full-precision tokens [num_quantized_values, num_tokens) live in explicit pages (kv_base, page_size,
//   kv_dtype, the layout above) listed per sequence in `residual[s]`: token j sits at slot
//   j - num_quantized_values[h] + residual_first_slot[h] of head h's residual page list (the store drops a
//   leading page once the window has slid past it, hence the first slot). Its V row is always read there; its
//   K row only when j >= num_quantized_keys (keys older than that are read from the quantized page).
// Attention over a KIVI stream is ordinary attention over the concatenation, quantized tokens first:
// [q.K_quant ; q.K_full] / sqrt(d), softmax, P_q.V_quant + P_f.V_full.
//
// kTurboQuant (vLLM's turboquant_* kv-cache dtypes): page p starts at kv_base + p * page_bytes and holds
// page_size slots of turboquant_slot_layout(head_dim, format).slot_bytes() bytes, slot t at t * slot_bytes, each
// a key record then a value record (backend/quant/turboquant_kv.h); kv_dtype is kU8. `bits` is the key bits (8:
// e4m3 keys), `value_bits` the value bits; MSE keys are read in the rotated domain through `rotation` (Pi,
// [head_dim, head_dim] row-major) and `centroids`. Page lists, token counts, causality and selection are those of
// explicit pages. The paper's store (turboquant_2.5|3.5) sets `turboquant_prod` instead: its slots are that codec's
// (backend/quant/turboquant_prod_kv.h), read with each KV head's channel orders `key_orders` and `value_orders`
// ([num_kv_heads][head_dim]); `bits` and `value_bits` are then its b.
enum class KvQuantScheme : uint8_t { kFp8E4M3, kKivi, kTurboQuant };

struct KiviSeqView {
  const int32_t* num_quantized_keys = nullptr;    // [num_kv_heads], multiples of group_size
  const int32_t* num_quantized_values = nullptr;  // [num_kv_heads]
  SeqKvView residual;                             // explicit pages; num_tokens = tokens held per head
  const int32_t* residual_first_slot = nullptr;   // [num_kv_heads], < page_size
};

struct QuantizedKvView {
  KvQuantScheme scheme = KvQuantScheme::kFp8E4M3;
  const float* k_scales = nullptr;  // kFp8E4M3: [num_kv_heads]
  const float* v_scales = nullptr;  // kFp8E4M3: [num_kv_heads]
  const void* quantized_base = nullptr;  // kKivi: the quantized pool
  size_t quantized_page_bytes = 0;       // kKivi: kivi_page_layout(...).page_bytes
  int32_t bits = 0;                      // kKivi; kTurboQuant: key bits
  int32_t group_size = 0;                // kKivi: tokens per key group and per quantized page
  int32_t value_group_size = 0;          // kKivi: channels per value group, divides head_dim
  const KiviSeqView* kivi_seqs = nullptr;  // kKivi: [num_seqs]
  int32_t value_bits = 0;                  // kTurboQuant
  bool norm_correction = false;            // kTurboQuant
  const float* rotation = nullptr;         // kTurboQuant, MSE keys: [head_dim, head_dim]
  const float* centroids = nullptr;        // kTurboQuant, MSE keys: [2^bits]
  const TurboQuantProdKvCodec* turboquant_prod = nullptr;  // kTurboQuant, the paper's store
  const int32_t* key_orders = nullptr;                     // kTurboQuant, the paper's store
  const int32_t* value_orders = nullptr;                   // kTurboQuant, the paper's store
};

// kLowRankLatent (a low-rank projection of K/V): the keys and values of each group of `group_heads` consecutive KV
// heads are kept as the group's latents, one row per token and group: [h_k (k_rank values) ; h_v (v_rank values)], so
// head_dim = k_rank + v_rank and num_kv_heads = the number of groups (a stream is one (layer, group)). Page p starts
// at kv_base + p * page_bytes and holds [page_size][head_dim] (the K half of the explicit layout, no V half);
// element(page, 0, offset) reads a row. The store never moves a token, so slot j holds position j. Attention
// rebuilds KV head i of group g as k = up_k[g][i * D .. (i + 1) * D) h_k + k_bias, RMS-normed by k_norm when set and
// rotated at position j, and takes each head's value latent o = sum_j p_j h_v,j, out = up_v[g][i * D ..) o + v_bias
// (U_v applied after attention). Page lists, token counts and causality are those of explicit pages; no
// selection.
struct LatentKvView {
  const float* up_k = nullptr;    // [groups, group_heads * kv_head_dim, k_rank]
  const float* up_v = nullptr;    // [groups, group_heads * kv_head_dim, v_rank]
  const float* k_bias = nullptr;  // [groups * group_heads * kv_head_dim] or null
  const float* v_bias = nullptr;  // [groups * group_heads * kv_head_dim] or null
  const float* k_norm = nullptr;  // [kv_head_dim] or null
  float norm_eps = 0.0f;
  int32_t k_rank = 0;
  int32_t v_rank = 0;
  int32_t group_heads = 0;
  int32_t kv_head_dim = 0;  // D, the model's head_dim
};

// Lists produced for a whole batch in one layout: sequence s, KV head h reads the ascending entries at
// lists + s * seq_stride + h * head_stride, counts[s * num_kv_heads + h] of them.
struct ProducedSelection {
  const int32_t* lists = nullptr;  // null: none
  int64_t seq_stride = 0;
  int32_t head_stride = 0;
  const int32_t* counts = nullptr;
};

struct AttentionView {
  void* kv_base = nullptr;
  Device kv_device = Device::kCpu;  // where the pool (kv_base) lives
  // Where q_indptr, seqs and the tables they point to live: the host for a cache's view, the pool's device for
  // its mirror (ops.h says which ops take which).
  Device tables_device = Device::kCpu;
  DType kv_dtype = DType::kF32;
  size_t page_bytes = 0;
  int32_t page_size = 0;
  int32_t head_dim = 0;
  int32_t num_kv_heads = 0;
  int32_t num_seqs = 0;
  const int32_t* q_indptr = nullptr;  // [num_seqs + 1] query rows per sequence
  const SeqKvView* seqs = nullptr;    // [num_seqs]
  SelectionUnit selection_unit = SelectionUnit::kToken;  // what SeqKvView::selected indexes
  bool has_selection = false;  // some sequence has a selected list (lets kernels pick the sparse path)
  // The most query rows of a sequence with a selected list (Selection::apply); -1 when not known. A batch whose
  // selected sequences are all decode rows lets a kernel run its prefill chunks densely.
  int32_t selected_rows_max = -1;
  // The selected lists are an op's output where the pool lives (device memory for a GPU pool), not host tables.
  bool selection_produced = false;
  // Set when every sequence's lists are one op's output in one layout; it then describes the same lists as the
  // SeqKvViews' selected pointers, and a device view may carry it alone (its SeqKvViews unselected).
  ProducedSelection produced;
  KvPayload payload = KvPayload::kExplicit;
  QuantizedKvView quantized;  // payload == kQuantized
  LatentKvView latent;        // payload == kLowRankLatent

  // Element pointer of token `offset` (< page_size) of K (kv = 0) or V (kv = 1) in page `page_id`.
  template <typename T>
  T* element(int32_t page_id, int kv, int32_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(kv_base) + static_cast<size_t>(page_id) * page_bytes) +
           (static_cast<size_t>(kv) * static_cast<size_t>(page_size) + static_cast<size_t>(offset)) *
               static_cast<size_t>(head_dim);
  }
};

inline bool is_kivi_view(const AttentionView& view) {
  return view.payload == KvPayload::kQuantized && view.quantized.scheme == KvQuantScheme::kKivi;
}

inline bool is_turboquant_view(const AttentionView& view) {
  return view.payload == KvPayload::kQuantized && view.quantized.scheme == KvQuantScheme::kTurboQuant;
}

// Tokens per page of a page selection (SelectionUnit::kPage): selected page p of a stream is its tokens
// [p * n, (p + 1) * n). The explicit page; over KIVI the key group (a quantized page), whatever the residual
// window's pages hold, so a selected page is one quantized group or the window's tokens of one.
inline int32_t selection_page_tokens(const AttentionView& view) {
  return is_kivi_view(view) ? view.quantized.group_size : view.page_size;
}

// Calls fn(page_id, tokens stored in that page, KV head) for every page of `view` that holds one of the batch's new
// tokens: the last n slots of each stream, n = the sequence's query rows. Reads the tables, so host views only.
template <typename Fn>
void for_each_page_with_new_tokens(const AttentionView& view, Fn&& fn) {
  const int32_t ps = view.page_size;
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const SeqKvView& sv = view.seqs[s];
    const int32_t n = view.q_indptr[s + 1] - view.q_indptr[s];
    for (int32_t h = 0; h < view.num_kv_heads; ++h) {
      const int32_t len = sv.num_tokens[h];
      if (n == 0 || len == 0) continue;
      const int32_t* pages = sv.page_ids + static_cast<int64_t>(h) * sv.stride;
      for (int32_t p = (len > n ? len - n : 0) / ps; p <= (len - 1) / ps; ++p)
        fn(pages[p], len - p * ps < ps ? len - p * ps : ps, h);
    }
  }
}

}  // namespace se
