// paged_attention over TurboQuant slots: values decode row by row as the tile reads them; MSE keys decode into the
// rotated domain (||k|| * c[idx]), against queries rotated once up front (Pi q), since q . Pi^T c = Pi q . c. So a
// key costs what an FP8 key costs and the d x d rotation runs once per query head, never per key.
// The paper's store (turboquant_prod_kv.h) runs the same tiles one level wider: each query becomes its 2 * head_dim
// projection [Pi q; S q] (per part, in its KV head's channel order) and each key the slot's matching 2 * head_dim
// values (scaled centroids, then scaled QJL signs), whose dot product is the unbiased estimate q . k~; values are
// summed in their rotated domain (the upper half of the wide rows stays zero) and each query's sum is rotated back
// to its channels once at the end.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/paged_attention_tiles.h"
#include "backend/quant/turboquant_kv.h"
#include "backend/quant/turboquant_prod_kv.h"
#include "tensor/fp8.h"

namespace se::cpu {

namespace {

// Slot j of a stream whose page list is `pages`.
const uint8_t* slot_of(const AttentionView& view, const int32_t* pages, int32_t j, size_t slot_bytes) {
  return static_cast<const uint8_t*>(view.kv_base) + static_cast<size_t>(pages[j / view.page_size]) * view.page_bytes +
         static_cast<size_t>(j % view.page_size) * slot_bytes;
}

struct TurboQuantRows {
  static constexpr bool kInPlace = false;
  const AttentionView* view;
  const int32_t* pages;  // the stream's page list
  TurboQuantSlotLayout layout;

  const uint8_t* slot(int32_t j) const { return slot_of(*view, pages, j, layout.slot_bytes()); }
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

// The paper's store, read by the tiles of a view twice the head's width (the codec's attention domain): keys are
// read_key's 2 * head_dim values, values read_value's head_dim values and head_dim zeros.
struct TurboQuantProdRows {
  static constexpr bool kInPlace = false;
  const AttentionView* view;  // the wide view
  const int32_t* pages;       // the stream's page list
  const TurboQuantProdKvCodec* codec;

  const uint8_t* slot(int32_t j) const { return slot_of(*view, pages, j, codec->layout().slot_bytes()); }
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

void paged_attention_turboquant_prod(TensorView out, TensorView q, const AttentionView& view,
                                     const AttentionParams& params) {
  const QuantizedKvView& qv = view.quantized;
  const TurboQuantProdKvCodec& codec = *qv.turboquant_prod;
  const int64_t dim = view.head_dim, wide = 2 * dim, vectors = q.numel() / dim;
  const int64_t num_heads = q.shape[1], group = num_heads / view.num_kv_heads;
  auto kv_head = [&](int64_t m) { return (m % num_heads) / group; };
  std::vector<float> projected(static_cast<size_t>(vectors * wide)), summed(projected.size());
  const float* in = q.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < vectors; ++m)
    codec.project_query(in + m * dim, qv.key_orders + kv_head(m) * dim, projected.data() + m * wide);
  AttentionView wide_view = view;
  wide_view.head_dim = static_cast<int32_t>(wide);
  const Shape wide_shape{q.shape[0], num_heads, wide};
  paged_attention_tiles(
      TensorView{summed.data(), DType::kF32, wide_shape}, TensorView{projected.data(), DType::kF32, wide_shape},
      wide_view, params, [&](int32_t s, int32_t h) {
        return TurboQuantProdRows{&wide_view, view.seqs[s].page_ids + static_cast<int64_t>(h) * view.seqs[s].stride,
                                  &codec};
      });
  float* o = out.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < vectors; ++m)
    codec.unrotate_value(summed.data() + m * wide, qv.value_orders + kv_head(m) * dim, o + m * dim);
}

}  // namespace

void paged_attention_turboquant(TensorView out, TensorView q, const AttentionView& view,
                                const AttentionParams& params) {
  const QuantizedKvView& qv = view.quantized;
  if (qv.turboquant_prod != nullptr) {
    paged_attention_turboquant_prod(out, q, view, params);
    return;
  }
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
