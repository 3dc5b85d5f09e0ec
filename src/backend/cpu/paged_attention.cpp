#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/paged_attention_tiles.h"
#include "backend/quant/fp8_kv.h"

namespace se::cpu {

void write_kv(const AttentionView& view, TensorView k, TensorView v) {
  const int32_t head_dim = view.head_dim;
  const int32_t num_kv_heads = view.num_kv_heads;
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const SeqKvView& sv = view.seqs[s];
    const int32_t row_begin = view.q_indptr[s];
    const int32_t n = view.q_indptr[s + 1] - row_begin;
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      const int32_t* pages = sv.page_ids + static_cast<int64_t>(h) * sv.stride;
      const int32_t first = sv.num_tokens[h] - n;
      for (int32_t r = 0; r < n; ++r) {
        const int32_t slot = first + r;
        const int32_t page = pages[slot / view.page_size];
        const int32_t offset = slot % view.page_size;
        const int64_t src = (static_cast<int64_t>(row_begin + r) * num_kv_heads + h) * head_dim;
        if (view.payload == KvPayload::kQuantized) {  // FP8 (ops.cpp admits no other quantized store here)
          fp8_quantize(k.ptr<float>() + src, static_cast<size_t>(head_dim), view.quantized.k_scales[h],
                       Fp8Format::kE4M3, view.element<uint8_t>(page, 0, offset));
          fp8_quantize(v.ptr<float>() + src, static_cast<size_t>(head_dim), view.quantized.v_scales[h],
                       Fp8Format::kE4M3, view.element<uint8_t>(page, 1, offset));
          continue;
        }
        std::memcpy(view.element<float>(page, 0, offset), k.ptr<float>() + src, sizeof(float) * head_dim);
        if (view.payload != KvPayload::kSharedLatent && view.payload != KvPayload::kLowRankLatent)
          std::memcpy(view.element<float>(page, 1, offset), v.ptr<float>() + src, sizeof(float) * head_dim);
      }
    }
  }
}

namespace {

// The explicit f32 pages: rows are read in place.
struct ExplicitRows {
  const AttentionView* view;
  const int32_t* pages;  // the stream's page list
  const float* key(int32_t j, float* /*local*/) const { return row(0, j); }
  const float* value(int32_t j, float* /*local*/) const { return row(1, j); }
  const float* row(int kv, int32_t j) const {
    return view->element<float>(pages[j / view->page_size], kv, j % view->page_size);
  }
};

}  // namespace

void paged_attention(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params) {
  paged_attention_tiles(out, q, view, params, [&](int32_t s, int32_t h) {
    return ExplicitRows{&view, view.seqs[s].page_ids + static_cast<int64_t>(h) * view.seqs[s].stride};
  });
}

}  // namespace se::cpu
