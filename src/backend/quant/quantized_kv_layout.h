// Byte geometry of the quantized KV pages that attention_view.h describes (kQuantized): where each part of a
// KIVI page lies, and the bytes a stream of one (layer, KV head) costs in the FP8 and KIVI stores, which the
// cache's pool sizing, the MemoryOracle's admission and `bench decode`'s roofline read instead of the explicit
// store's 2 * head_dim * dtype bytes per token. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/quant/kivi_quant.h"

namespace se {

// FP8 pages: one byte per element of the explicit layout. The per-head scales (8 bytes per KV head per layer)
// are not per token.
inline size_t fp8_kv_bytes_per_token(int32_t head_dim) { return 2 * static_cast<size_t>(head_dim); }

// Byte offsets of the parts of one KIVI quantized page (attention_view.h gives their shapes), and its size.
struct KiviPageLayout {
  int32_t key_words = 0;     // uint32 words per channel: W(group_size)
  int32_t value_words = 0;   // uint32 words per token: W(head_dim)
  int32_t value_groups = 0;  // groups per token: head_dim / value_group_size
  size_t key_codes = 0, value_codes = 0, key_scale = 0, key_min = 0, value_scale = 0, value_min = 0;
  size_t page_bytes = 0;  // holds group_size tokens
};

// bits 2, 4 or 8; group_size a positive multiple of 32 / bits (kivi_quantize_row's word alignment);
// value_group_size divides head_dim. Checked by the caller's config.
inline KiviPageLayout kivi_page_layout(int32_t group_size, int32_t value_group_size, int32_t head_dim,
                                       int32_t bits) {
  KiviPageLayout l;
  l.key_words = static_cast<int32_t>(kivi_num_words(group_size, bits));
  l.value_words = static_cast<int32_t>(kivi_num_words(head_dim, bits));
  l.value_groups = head_dim / value_group_size;
  const auto d = static_cast<size_t>(head_dim), g = static_cast<size_t>(group_size);
  l.key_codes = 0;
  l.value_codes = l.key_codes + d * static_cast<size_t>(l.key_words) * sizeof(uint32_t);
  l.key_scale = l.value_codes + g * static_cast<size_t>(l.value_words) * sizeof(uint32_t);
  l.key_min = l.key_scale + d * sizeof(uint16_t);
  l.value_scale = l.key_min + d * sizeof(uint16_t);
  l.value_min = l.value_scale + g * static_cast<size_t>(l.value_groups) * sizeof(uint16_t);
  l.page_bytes = l.value_min + g * static_cast<size_t>(l.value_groups) * sizeof(uint16_t);
  return l;
}

// Bytes per quantized token: codes plus its share of the fp16 scales and minima (e.g. 2-bit, group 32, value
// group 32, head_dim 128: 64 code bytes + 16 key + 16 value parameter bytes = 96, against 512 for bf16).
inline double kivi_quantized_bytes_per_token(const KiviPageLayout& layout, int32_t group_size) {
  return static_cast<double>(layout.page_bytes) / group_size;
}

// The most bytes one KIVI stream of num_tokens tokens holds: the quantized pages of its quantized keys (values
// quantize into the same pages and never outrun the keys) plus the explicit pages of its full-precision window
// (at most `residual` tokens, starting anywhere in its first page). explicit_page_bytes and page_size describe
// the explicit pages of the residual.
inline size_t kivi_stream_bytes(int64_t num_tokens, int64_t residual, int32_t group_size,
                                const KiviPageLayout& layout, int32_t page_size, size_t explicit_page_bytes) {
  const int64_t quantized_keys = num_tokens / residual * residual;
  const int64_t quantized_values = num_tokens > residual ? num_tokens - residual : 0;
  const int64_t full = num_tokens - quantized_values;
  const int64_t residual_pages = full == 0 ? 0 : (full + page_size - 1 + page_size - 1) / page_size;
  return static_cast<size_t>(quantized_keys / group_size) * layout.page_bytes +
         static_cast<size_t>(residual_pages) * explicit_page_bytes;
}

}  // namespace se
