#include <cstring>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void gather_keys(TensorView out, const AttentionView& view, int32_t slice, int32_t first_slot) {
  const int64_t n = out.shape[0];
  const size_t bytes = sizeof(float) * static_cast<size_t>(view.head_dim);
  const SeqKvView& sv = view.seqs[slice];
  float* dst = out.ptr<float>();
  for (int32_t h = 0; h < view.num_kv_heads; ++h) {
    const int32_t* pages = sv.page_ids + static_cast<int64_t>(h) * sv.stride;
    for (int64_t t = 0; t < n; ++t) {
      const auto slot = static_cast<int32_t>(first_slot + t);
      std::memcpy(dst + (t * view.num_kv_heads + h) * view.head_dim,
                  view.element<float>(pages[slot / view.page_size], 0, slot % view.page_size), bytes);
    }
  }
}

}  // namespace se::cpu
