// paged_attention over FP8 (e4m3) pages: the explicit layout at one byte per element, each row decoded with its
// KV head's scale as the tile reads it (keys before the logits, values before the weighted sum).
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/paged_attention_tiles.h"
#include "backend/quant/fp8_kv.h"

namespace se::cpu {

namespace {

struct Fp8Rows {
  const AttentionView* view;
  const int32_t* pages;  // the stream's page list
  float k_scale, v_scale;

  const float* key(int32_t j, float* local) const { return decode(0, j, k_scale, local); }
  const float* value(int32_t j, float* local) const { return decode(1, j, v_scale, local); }
  const float* decode(int kv, int32_t j, float scale, float* local) const {
    const uint8_t* codes = view->element<const uint8_t>(pages[j / view->page_size], kv, j % view->page_size);
    fp8_dequantize(codes, static_cast<size_t>(view->head_dim), scale, Fp8Format::kE4M3, local);
    return local;
  }
};

}  // namespace

void paged_attention_fp8(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params) {
  paged_attention_tiles(out, q, view, params, [&](int32_t s, int32_t h) {
    return Fp8Rows{&view, view.seqs[s].page_ids + static_cast<int64_t>(h) * view.seqs[s].stride,
                   view.quantized.k_scales[h], view.quantized.v_scales[h]};
  });
}

}  // namespace se::cpu
