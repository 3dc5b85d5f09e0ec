// Row copies inside a pool, for any page the CPU keeps (f32 K/V, FP8 codes, TurboQuant slots): a token's bytes are
// copied as they are. A token has a K and a V row of head_dim elements of the pool's dtype, or one latent row in a
// shared or low-rank latent pool, or one slot (a key record and a value record) in a TurboQuant pool.
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/turboquant_rows.h"

namespace se::cpu {

namespace {

// A token's bytes in a page: `pieces` runs of `bytes`, piece p of the token at slot `offset` starting at
// (p * page_size + offset) * bytes.
struct TokenBytes {
  int pieces;
  size_t bytes;

  static TokenBytes of(const AttentionView& pool) {
    if (is_turboquant_view(pool)) return {1, pool.page_bytes / static_cast<size_t>(pool.page_size)};
    const bool one_row = pool.payload == KvPayload::kSharedLatent || pool.payload == KvPayload::kLowRankLatent;
    return {one_row ? 1 : 2, dtype_size(pool.kv_dtype) * static_cast<size_t>(pool.head_dim)};
  }
  char* piece(const AttentionView& pool, int32_t page_id, int p, int32_t offset) const {
    return static_cast<char*>(pool.kv_base) + static_cast<size_t>(page_id) * pool.page_bytes +
           (static_cast<size_t>(p) * static_cast<size_t>(pool.page_size) + static_cast<size_t>(offset)) * bytes;
  }
  void copy(const AttentionView& pool, int32_t dest_page, int32_t dest_offset, int32_t source_page,
            int32_t source_offset) const {
    for (int p = 0; p < pieces; ++p)
      std::memcpy(piece(pool, dest_page, p, dest_offset), piece(pool, source_page, p, source_offset), bytes);
  }
};

}  // namespace

void compact_kv(const AttentionView& pool, std::span<const StreamCompaction> streams) {
  const TokenBytes token = TokenBytes::of(pool);
  for (const StreamCompaction& s : streams) {
    // In slot order, so every source is read before a later slot overwrites it.
    for (size_t i = 0; i < s.kept.size(); ++i) {
      const int32_t src = s.kept[i];
      const auto dst = static_cast<int32_t>(i);
      if (src == dst) continue;
      token.copy(pool, s.pages[dst / pool.page_size], dst % pool.page_size, s.pages[src / pool.page_size],
                 src % pool.page_size);
    }
  }
}

void move_kv_rows(const AttentionView& pool, std::span<const KvRowMove> moves) {
  const TokenBytes token = TokenBytes::of(pool);
  for (const KvRowMove& m : moves) token.copy(pool, m.dest_page, m.dest_offset, m.source_page, m.source_offset);
}

}  // namespace se::cpu
