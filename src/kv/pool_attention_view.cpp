#include "kv/pool_attention_view.h"

namespace se {

AttentionView pool_attention_view(const KvLayout& layout, const PageStorage& pool, std::span<const SeqKvView> seqs,
                                  const int32_t* q_indptr) {
  AttentionView view;
  view.kv_base = pool.base();
  view.kv_device = pool.device();
  view.kv_dtype = layout.dtype;
  view.page_bytes = layout.page_bytes();
  view.page_size = layout.page_size;
  view.head_dim = layout.head_dim;
  view.num_kv_heads = layout.num_kv_heads;
  view.num_seqs = static_cast<int32_t>(seqs.size());
  view.q_indptr = q_indptr;
  view.seqs = seqs.data();
  return view;
}

}  // namespace se
