// Which stored keys one query row of one (sequence, KV head) reads on the CPU backend: the causally visible
// range [first, last] of the stream (physical causality and the sliding window, see attention_view.h), narrowed
// to the selected tokens or pages when the sequence carries a selection. Shared by every CPU attention op so
// they agree on visibility.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/kivi_rows.h"
#include "backend/cpu/turboquant_rows.h"
#include "backend/cpu/vector_math.h"
#include "backend/ops.h"
#include "backend/quant/fp8_kv.h"

namespace se::cpu {

struct VisibleRange {
  int32_t first = 0;
  int32_t last = -1;  // inclusive; last < first = nothing visible
};

// Visible range of query row `row` (0-based within the sequence's `num_rows` new rows) on KV head `kv_head`.
inline VisibleRange visible_range(const SeqKvView& sv, int32_t kv_head, int32_t num_rows, int32_t row,
                                  int sliding_window) {
  VisibleRange r;
  r.last = sv.num_tokens[kv_head] - num_rows + row;
  r.first = sliding_window > 0 ? std::max(0, r.last - sliding_window + 1) : 0;
  return r;
}

// Calls fn(token_index) for every key of `range` that the sequence's selection keeps, in ascending order.
template <typename Fn>
void for_each_visible_key(const AttentionView& view, const SeqKvView& sv, int32_t kv_head, VisibleRange range,
                          Fn&& fn) {
  if (sv.selected == nullptr) {
    for (int32_t j = range.first; j <= range.last; ++j) fn(j);
    return;
  }
  const int32_t* sel = sv.selected + static_cast<int64_t>(kv_head) * sv.selected_stride;
  const int32_t n = sv.num_selected[kv_head];
  const int32_t unit = view.selection_unit == SelectionUnit::kPage ? selection_page_tokens(view) : 1;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t begin = std::max(sel[i] * unit, range.first);
    const int32_t end = std::min(sel[i] * unit + unit - 1, range.last);
    for (int32_t j = begin; j <= end; ++j) fn(j);
  }
}

// The attention logits of query `q` (head_dim values) against every key for_each_visible_key yields in sequence
// `slice` of the view: keys[i] = the token index, logits[i] = q . k * scale (soft-capped when configured). Returns
// the largest logit (-inf when nothing is visible). Keys are f32 rows, FP8 codes decoded with their KV head's scale,
// a KIVI stream's keys (kivi_rows.h: quantized groups decoded, window rows read as they are) or TurboQuant slots'
// keys in their query's domain (turboquant_rows.h: `q` is then turboquant_query's, turboquant_key_width values),
// each decoded into a per-thread row as it is read.
inline float visible_logits(const AttentionView& view, int32_t slice, int32_t kv_head, VisibleRange range,
                            const float* q, const AttentionParams& params, std::vector<int32_t>& keys,
                            std::vector<float>& logits) {
  const SeqKvView& sv = view.seqs[slice];
  const int32_t* pages = sv.page_ids + static_cast<int64_t>(kv_head) * sv.stride;
  keys.clear();
  logits.clear();
  float max_logit = -std::numeric_limits<float>::infinity();
  const bool quantized = view.payload == KvPayload::kQuantized;
  const bool kivi = is_kivi_view(view);
  const KiviPageLayout kivi_layout = kivi ? kivi_page_layout(view.quantized.group_size, view.quantized.value_group_size,
                                                             view.head_dim, view.quantized.bits)
                                          : KiviPageLayout{};
  const KiviRows kivi_rows = kivi ? KiviRows::of(view, kivi_layout, slice, kv_head) : KiviRows{};
  const bool turboquant = is_turboquant_view(view);
  const TurboQuantRows turboquant_rows = turboquant ? TurboQuantRows::of(view, pages) : TurboQuantRows{};
  const TurboQuantProdRows turboquant_prod_rows{&view, pages, view.quantized.turboquant_prod};
  const int32_t width = turboquant ? turboquant_key_width(view) : view.head_dim;
  thread_local std::vector<float> decoded;
  if (quantized) decoded.resize(static_cast<size_t>(width));
  for_each_visible_key(view, sv, kv_head, range, [&](int32_t j) {
    const float* k = nullptr;
    if (kivi) {
      k = kivi_rows.key(j, decoded.data());
    } else if (turboquant) {
      k = turboquant_prod_rows.codec != nullptr ? turboquant_prod_rows.key(j, decoded.data())
                                                : turboquant_rows.key(j, decoded.data());
    } else if (quantized) {
      fp8_dequantize(view.element<const uint8_t>(pages[j / view.page_size], 0, j % view.page_size),
                     static_cast<size_t>(view.head_dim), view.quantized.k_scales[kv_head], Fp8Format::kE4M3,
                     decoded.data());
      k = decoded.data();
    } else {
      k = view.element<float>(pages[j / view.page_size], 0, j % view.page_size);
    }
    float logit = dot(q, k, width) * params.scale;
    if (params.logit_softcap > 0.0f) logit = params.logit_softcap * std::tanh(logit / params.logit_softcap);
    keys.push_back(j);
    logits.push_back(logit);
    max_logit = std::max(max_logit, logit);
  });
  return max_logit;
}

}  // namespace se::cpu
