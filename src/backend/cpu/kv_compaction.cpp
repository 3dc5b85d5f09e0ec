// Row copies inside a pool, for any element type the CPU keeps (f32 K/V, FP8 codes): a row is head_dim elements
// of the pool's dtype, copied as bytes; a token has a K and a V row, or one latent row in a shared or low-rank
// latent pool.
#include <cstring>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

namespace {

// The rows a token has in `pool`'s pages: K and V, or its latent alone.
int rows_per_token(const AttentionView& pool) {
  return pool.payload == KvPayload::kSharedLatent || pool.payload == KvPayload::kLowRankLatent ? 1 : 2;
}

char* kv_row(const AttentionView& pool, int32_t page_id, int kv, int32_t offset) {
  const size_t element = (static_cast<size_t>(kv) * static_cast<size_t>(pool.page_size) + static_cast<size_t>(offset)) *
                         static_cast<size_t>(pool.head_dim);
  return static_cast<char*>(pool.kv_base) + static_cast<size_t>(page_id) * pool.page_bytes +
         element * dtype_size(pool.kv_dtype);
}

}  // namespace

void compact_kv(const AttentionView& pool, std::span<const StreamCompaction> streams) {
  const size_t bytes = dtype_size(pool.kv_dtype) * static_cast<size_t>(pool.head_dim);
  for (const StreamCompaction& s : streams) {
    // In slot order, so every source is read before a later slot overwrites it.
    for (size_t i = 0; i < s.kept.size(); ++i) {
      const int32_t src = s.kept[i];
      const auto dst = static_cast<int32_t>(i);
      if (src == dst) continue;
      for (int kv = 0; kv < rows_per_token(pool); ++kv)
        std::memcpy(kv_row(pool, s.pages[dst / pool.page_size], kv, dst % pool.page_size),
                    kv_row(pool, s.pages[src / pool.page_size], kv, src % pool.page_size), bytes);
    }
  }
}

void move_kv_rows(const AttentionView& pool, std::span<const KvRowMove> moves) {
  const size_t bytes = dtype_size(pool.kv_dtype) * static_cast<size_t>(pool.head_dim);
  for (const KvRowMove& m : moves)
    for (int kv = 0; kv < rows_per_token(pool); ++kv)
      std::memcpy(kv_row(pool, m.dest_page, kv, m.dest_offset), kv_row(pool, m.source_page, kv, m.source_offset),
                  bytes);
}

}  // namespace se::cpu
