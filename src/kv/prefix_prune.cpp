#include "kv/prefix_prune.h"

#include <algorithm>

namespace se {

RadixCache::BlockRange blocks_inside(TokenRange range, int32_t page_size,
                                     int32_t num_cached_blocks) {
  const int32_t first = (std::max(range.start, 0) + page_size - 1) / page_size;
  const int32_t end = std::min(std::max(range.end, 0) / page_size, num_cached_blocks);
  return end > first ? RadixCache::BlockRange{first, end} : RadixCache::BlockRange{first, first};
}

int32_t num_kept_blocks(int32_t keep_tokens, int32_t num_blocks, int32_t page_size) {
  const int32_t kept = (std::max(keep_tokens, 0) + page_size - 1) / page_size;
  return std::min(kept, num_blocks);
}

}  // namespace se
