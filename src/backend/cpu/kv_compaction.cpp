#include <cstring>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void compact_kv(const AttentionView& view, int32_t seq, int32_t kv_head, const std::vector<int32_t>& kept) {
  const SeqKvView& sv = view.seqs[seq];
  const int32_t* pages = sv.page_ids + static_cast<int64_t>(kv_head) * sv.stride;
  const size_t bytes = sizeof(float) * static_cast<size_t>(view.head_dim);
  for (size_t i = 0; i < kept.size(); ++i) {
    const int32_t src = kept[i];
    const int32_t dst = static_cast<int32_t>(i);
    if (src == dst) continue;
    for (int kv = 0; kv < 2; ++kv)
      std::memcpy(view.element<float>(pages[dst / view.page_size], kv, dst % view.page_size),
                  view.element<float>(pages[src / view.page_size], kv, src % view.page_size), bytes);
  }
}

}  // namespace se::cpu
