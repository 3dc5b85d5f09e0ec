#include <cstring>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void compact_kv(const AttentionView& pool, std::span<const StreamCompaction> streams) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(pool.head_dim);
  for (const StreamCompaction& s : streams) {
    // In slot order, so every source is read before a later slot overwrites it.
    for (size_t i = 0; i < s.kept.size(); ++i) {
      const int32_t src = s.kept[i];
      const auto dst = static_cast<int32_t>(i);
      if (src == dst) continue;
      for (int kv = 0; kv < 2; ++kv)
        std::memcpy(pool.element<float>(s.pages[dst / pool.page_size], kv, dst % pool.page_size),
                    pool.element<float>(s.pages[src / pool.page_size], kv, src % pool.page_size), bytes);
    }
  }
}

void move_kv_rows(const AttentionView& pool, std::span<const KvRowMove> moves) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(pool.head_dim);
  for (const KvRowMove& m : moves)
    for (int kv = 0; kv < 2; ++kv)
      std::memcpy(pool.element<float>(m.dest_page, kv, m.dest_offset),
                  pool.element<float>(m.source_page, kv, m.source_offset), bytes);
}

}  // namespace se::cpu
