// paged_attention over KIVI pages (attention_view.h, kKivi): each row is decoded as the tile reads it (kivi_rows.h),
// so attention is ordinary attention over the concatenation, quantized tokens first.
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kivi_rows.h"
#include "backend/cpu/paged_attention_tiles.h"

namespace se::cpu {

void paged_attention_kivi(TensorView out, TensorView q, const AttentionView& view, const AttentionParams& params) {
  const QuantizedKvView& qv = view.quantized;
  const KiviPageLayout layout = kivi_page_layout(qv.group_size, qv.value_group_size, view.head_dim, qv.bits);
  paged_attention_tiles(out, q, view, params, [&](int32_t s, int32_t h) { return KiviRows::of(view, layout, s, h); });
}

}  // namespace se::cpu
