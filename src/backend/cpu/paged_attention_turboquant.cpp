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
#include "backend/cpu/turboquant_rows.h"

namespace se::cpu {

namespace {

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
    turboquant_query(view, static_cast<int32_t>(kv_head(m)), in + m * dim, projected.data() + m * wide);
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
  auto reader = [&](int32_t s, int32_t h) {
    return TurboQuantRows::of(view, view.seqs[s].page_ids + static_cast<int64_t>(h) * view.seqs[s].stride);
  };
  if (qv.bits == 8) {
    paged_attention_tiles(out, q, view, params, reader);
    return;
  }
  const int64_t dim = view.head_dim, vectors = q.numel() / dim;
  std::vector<float> rotated(static_cast<size_t>(q.numel()));
  const float* in = q.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < vectors; ++m) turboquant_query(view, 0, in + m * dim, rotated.data() + m * dim);
  paged_attention_tiles(out, TensorView{rotated.data(), DType::kF32, q.shape}, view, params, reader);
}

}  // namespace se::cpu
