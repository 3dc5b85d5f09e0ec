// pool_attention_view: the AttentionView of sequences whose pages lie in one pool of a KvLayout's pages: where the
// pool is, its page geometry, and the sequences' page lists and query rows. A quantized store's payload is the
// caller's to add. The view points at `seqs` and `q_indptr`, which must outlive it.
#pragma once

#include <cstdint>
#include <span>

#include "backend/attention_view.h"
#include "kv/kv_layout.h"
#include "kv/page_storage.h"

namespace se {

// q_indptr: [seqs.size() + 1] offsets of each sequence's query rows.
AttentionView pool_attention_view(const KvLayout& layout, const PageStorage& pool, std::span<const SeqKvView> seqs,
                                  const int32_t* q_indptr);

}  // namespace se
