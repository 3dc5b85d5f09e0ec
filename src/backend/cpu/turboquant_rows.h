// How the CPU backend reads TurboQuant slots (attention_view.h, kTurboQuant): each key in the domain its query is
// taken to once per head, so a key costs a decode and a dot product. vLLM's presets read MSE keys in the rotated
// domain (||k|| * c[idx], against Pi q) and 8-bit keys as FP8; the paper's store (turboquant_prod_kv.h) reads a
// key as the 2 * head_dim values whose dot product with the query's projection [Pi q; S q] is the unbiased q . k~.
// paged_attention's tiles and attention_scores' logits share these readers, so both see the same logits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/attention_view.h"
#include "backend/cpu/vector_math.h"
#include "backend/quant/fp8_kv.h"
#include "backend/quant/turboquant_kv.h"
#include "backend/quant/turboquant_prod_kv.h"

namespace se::cpu {

// Slot j of a stream whose page list is `pages`.
inline const uint8_t* turboquant_slot(const AttentionView& view, const int32_t* pages, int32_t j, size_t slot_bytes) {
  return static_cast<const uint8_t*>(view.kv_base) + static_cast<size_t>(pages[j / view.page_size]) * view.page_bytes +
         static_cast<size_t>(j % view.page_size) * slot_bytes;
}

// vLLM's presets: keys in their query's domain (turboquant_query), values in their channels.
struct TurboQuantRows {
  const AttentionView* view;
  const int32_t* pages;  // the stream's page list
  TurboQuantSlotLayout layout;

  static TurboQuantRows of(const AttentionView& view, const int32_t* pages) {
    const QuantizedKvView& qv = view.quantized;
    return {&view, pages,
            turboquant_slot_layout(view.head_dim, TurboQuantKvFormat{qv.bits, qv.value_bits, qv.norm_correction})};
  }
  const uint8_t* slot(int32_t j) const { return turboquant_slot(*view, pages, j, layout.slot_bytes()); }
  const float* key(int32_t j, float* local) const {
    const QuantizedKvView& qv = view->quantized;
    if (qv.bits == 8) {
      fp8_dequantize(slot(j), static_cast<size_t>(view->head_dim), 1.0f, Fp8Format::kE4M3, local);
    } else {
      turboquant_decode_rotated_key(slot(j), view->head_dim, qv.bits, qv.centroids, qv.norm_correction, local);
    }
    return local;
  }
  const float* value(int32_t j, float* local) const {
    turboquant_decode_value(slot(j) + layout.key_bytes, view->head_dim, view->quantized.value_bits, local);
    return local;
  }
};

// The paper's store, read through a view twice the head's width (the codec's attention domain): keys are read_key's
// 2 * head_dim values, values read_value's head_dim values and head_dim zeros.
struct TurboQuantProdRows {
  const AttentionView* view;  // the wide view
  const int32_t* pages;       // the stream's page list
  const TurboQuantProdKvCodec* codec;

  const uint8_t* slot(int32_t j) const { return turboquant_slot(*view, pages, j, codec->layout().slot_bytes()); }
  const float* key(int32_t j, float* local) const {
    codec->read_key(slot(j), local);
    return local;
  }
  const float* value(int32_t j, float* local) const {
    codec->read_value(slot(j), local);
    std::fill(local + codec->head_dim(), local + view->head_dim, 0.0f);
    return local;
  }
};

// Values per key and per query in the domain a TurboQuant view's keys are read in.
inline int32_t turboquant_key_width(const AttentionView& view) {
  return view.quantized.turboquant_prod != nullptr ? 2 * view.head_dim : view.head_dim;
}

// Query q [head_dim] of KV head `kv_head` into that domain, out [turboquant_key_width(view)].
inline void turboquant_query(const AttentionView& view, int32_t kv_head, const float* q, float* out) {
  const QuantizedKvView& qv = view.quantized;
  const int32_t dim = view.head_dim;
  if (qv.turboquant_prod != nullptr) {
    qv.turboquant_prod->project_query(q, qv.key_orders + int64_t{kv_head} * dim, out);
  } else if (qv.bits == 8) {
    std::copy_n(q, dim, out);
  } else {
    for (int32_t i = 0; i < dim; ++i) out[i] = dot(qv.rotation + int64_t{i} * dim, q, dim);
  }
}

}  // namespace se::cpu
