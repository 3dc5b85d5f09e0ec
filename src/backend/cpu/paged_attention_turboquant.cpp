// paged_attention over TurboQuant slots: values decode row by row as the tile reads them; MSE keys decode into the
// rotated domain (||k|| * c[idx]), against queries rotated once up front (Pi q), since q . Pi^T c = Pi q . c. So a
// key costs what an FP8 key costs and the d x d rotation runs once per query head, never per key.
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/paged_attention_tiles.h"
#include "backend/quant/turboquant_kv.h"
#include "tensor/fp8.h"

namespace se::cpu {

namespace {

struct TurboQuantRows {
  static constexpr bool kInPlace = false;
  const AttentionView* view;
  const int32_t* pages;  // the stream's page list
  TurboQuantSlotLayout layout;

  const uint8_t* slot(int32_t j) const {
    return static_cast<const uint8_t*>(view->kv_base) +
           static_cast<size_t>(pages[j / view->page_size]) * view->page_bytes +
           static_cast<size_t>(j % view->page_size) * layout.slot_bytes();
  }
  const float* key(int32_t j, float* local) const {
    const QuantizedKvView& qv = view->quantized;
    if (qv.bits == 8) {
      for (int32_t d = 0; d < view->head_dim; ++d) local[d] = fp8_to_f32(slot(j)[d], Fp8Format::kE4M3);
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

}  // namespace

void paged_attention_turboquant(TensorView out, TensorView q, const AttentionView& view,
                                const AttentionParams& params) {
  const QuantizedKvView& qv = view.quantized;
  const TurboQuantSlotLayout layout =
      turboquant_slot_layout(view.head_dim, TurboQuantKvFormat{qv.bits, qv.value_bits, qv.norm_correction});
  auto reader = [&](int32_t s, int32_t h) {
    return TurboQuantRows{&view, view.seqs[s].page_ids + static_cast<int64_t>(h) * view.seqs[s].stride, layout};
  };
  if (qv.bits == 8) {
    paged_attention_tiles(out, q, view, params, reader);
    return;
  }
  const int64_t dim = view.head_dim, vectors = q.numel() / dim;
  std::vector<float> rotated(static_cast<size_t>(q.numel()));
  const float* in = q.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < vectors; ++m)
    for (int64_t i = 0; i < dim; ++i) rotated[m * dim + i] = dot(qv.rotation + i * dim, in + m * dim, view.head_dim);
  paged_attention_tiles(out, TensorView{rotated.data(), DType::kF32, q.shape}, view, params, reader);
}

}  // namespace se::cpu
