// Prefix pruning, the part that does not depend on a scoring policy: an application names token
// ranges [start, end) of a cached prefix; each is narrowed to the whole cached blocks inside it,
// and the positions a policy keeps are rounded up to whole pages, so a pruned segment of n blocks
// keeps exactly m <= n full pages per stream (layer, KV head) and the blocks after it stay
// page-aligned in every sequence's page table. The radix cache (radix_cache.h) stores the result;
// the paged cache manager compacts the KV. Plain functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/radix_cache.h"

namespace se {

// Token positions [start, end), 0-based, half-open.
struct TokenRange {
  int32_t start = 0;
  int32_t end = 0;
};

// The whole blocks inside `range` (start rounded up, end rounded down to page_size multiples), cut
// to the first `num_cached_blocks` blocks; empty (first_block == end_block) when none is left.
RadixCache::BlockRange blocks_inside(TokenRange range, int32_t page_size,
                                     int32_t num_cached_blocks);

// Blocks a segment of `num_blocks` blocks keeps when a policy keeps `keep_tokens` of its positions:
// the kept count rounded up to whole pages (the next-best positions fill the last page), at most
// num_blocks.
int32_t num_kept_blocks(int32_t keep_tokens, int32_t num_blocks, int32_t page_size);

// The outcome of pruning one range.
struct PrunedRange {
  TokenRange requested;
  TokenRange effective;           // what was pruned: the whole cached blocks inside it (a chain: all of it)
  RadixCache::BlockRange blocks;  // radix cache: the effective blocks (empty: nothing prunable in the range)
  std::vector<int32_t> kept_positions;  // ascending absolute positions it keeps (radix cache: whole pages of them)
  int32_t num_freed_pages = 0;         // pages that went back to the pool
};

}  // namespace se
