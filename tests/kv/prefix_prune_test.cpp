// Pruned segments of the radix cache (ids only; the KV compaction is tested with the paged cache
// manager).
#include "kv/prefix_prune.h"

#include <gtest/gtest.h>

#include <numeric>

#include "kv/radix_cache.h"
#include "radix_cache_fixture.h"

namespace se {
namespace {

using test::iota_tokens;
using test::small_layout;
constexpr int32_t kStreams = 4;

class PrefixPruneTest : public test::RadixCacheFixture {
 protected:
  // Prunes blocks [first, end) of `tokens` keeping `kept` blocks; returns the pages freed.
  int32_t prune(const std::vector<int32_t>& tokens, int32_t first, int32_t end, int32_t kept) {
    auto nodes = cache_.prunable_nodes(tokens, first, end);
    EXPECT_TRUE(nodes.is_ok()) << nodes.status().to_string();
    if (!nodes.is_ok()) return -1;
    std::vector<int32_t> kept_offsets(static_cast<size_t>(kept) * 4);
    std::iota(kept_offsets.begin(), kept_offsets.end(), 0);
    const int32_t freed = cache_.commit_prune(*nodes, kept_offsets);
    expect_intact();
    return freed;
  }
};

TEST(PrefixPruneRangeTest, NarrowsToWholeCachedBlocks) {
  const auto b = blocks_inside({5, 19}, 4, 10);  // [8, 16): blocks 2, 3
  EXPECT_EQ(b.first_block, 2);
  EXPECT_EQ(b.end_block, 4);
  const auto cut = blocks_inside({0, 40}, 4, 3);  // only 3 blocks cached
  EXPECT_EQ(cut.first_block, 0);
  EXPECT_EQ(cut.end_block, 3);
  const auto none = blocks_inside({5, 7}, 4, 10);  // no whole block inside
  EXPECT_EQ(none.first_block, none.end_block);
  EXPECT_EQ(num_kept_blocks(0, 5, 4), 0);
  EXPECT_EQ(num_kept_blocks(1, 5, 4), 1);
  EXPECT_EQ(num_kept_blocks(8, 5, 4), 2);
  EXPECT_EQ(num_kept_blocks(9, 5, 4), 3);
  EXPECT_EQ(num_kept_blocks(100, 5, 4), 5);
}

TEST_F(PrefixPruneTest, FreesTheDroppedPagesExactly) {
  const auto tokens = iota_tokens(24);  // 6 blocks
  insert_and_free(tokens);
  const int32_t used = pool_.num_used_pages();
  EXPECT_EQ(used, 6 * kStreams);
  EXPECT_EQ(prune(tokens, 1, 5, 1), 3 * kStreams);  // 4 blocks keep 1 page per stream
  EXPECT_EQ(pool_.num_used_pages(), used - 3 * kStreams);
  EXPECT_EQ(cache_.num_cached_pages(), 3 * kStreams);
  EXPECT_EQ(cache_.num_evictable_pages(), 3 * kStreams);
  EXPECT_EQ(cache_.num_nodes(), 6);  // every block stays matchable
}

TEST_F(PrefixPruneTest, PrunedPrefixStillMatchesWithItsResidentPages) {
  const auto tokens = iota_tokens(24);
  insert_and_free(tokens);
  const auto before = cache_.peek_prefix(tokens);
  ASSERT_EQ(before.num_blocks(), 6);
  prune(tokens, 1, 5, 2);
  const auto match = cache_.match_prefix(iota_tokens(25));
  EXPECT_EQ(match.num_cached_tokens, 24);
  EXPECT_EQ(match.num_resident_blocks, 4);  // blocks 0, 1, 2 (holding the kept KV) and 5
  ASSERT_EQ(match.pruned_segments.size(), 1U);
  EXPECT_EQ(match.pruned_segments[0].first_block, 1);
  EXPECT_EQ(match.pruned_segments[0].end_block, 5);
  // The positions those pages hold: block 0, the kept offsets 0..7 of the segment from token 4,
  // block 5.
  const auto peeked = cache_.peek_prefix(tokens);
  EXPECT_EQ(peeked.resident_positions,
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23}));
  // Stream-major resident pages: the segment's first two nodes keep their own pages.
  for (int32_t s = 0; s < kStreams; ++s) {
    const auto row = std::span(match.pages).subspan(static_cast<size_t>(s) * 4, 4);
    const auto all = std::span(before.pages).subspan(static_cast<size_t>(s) * 6, 6);
    EXPECT_EQ(row[0], all[0]);
    EXPECT_EQ(row[1], all[1]);
    EXPECT_EQ(row[2], all[2]);
    EXPECT_EQ(row[3], all[5]);
  }
  expect_intact();
}

TEST_F(PrefixPruneTest, PartialMatchStopsBeforeTheSegment) {
  const auto tokens = iota_tokens(24);
  insert_and_free(tokens);
  prune(tokens, 1, 5, 1);
  // 18 tokens: whole blocks 0-3 would end inside the segment [1, 5).
  auto match = cache_.match_prefix(iota_tokens(18));
  EXPECT_EQ(match.num_blocks(), 1);
  EXPECT_EQ(match.num_resident_blocks, 1);
  EXPECT_TRUE(match.pruned_segments.empty());
  // A prompt that diverges inside the segment stops before it too.
  auto diverging = iota_tokens(30);
  diverging[13] = 999;
  match = cache_.match_prefix(diverging);
  EXPECT_EQ(match.num_blocks(), 1);
  // Locking the result is allowed; locking an inner segment node is not reachable through matches.
  cache_.lock(match.last_node());
  cache_.unlock(match.last_node());
  expect_intact();
}

TEST_F(PrefixPruneTest, InsertAfterAPrunedPrefixMapsPagesWithTheOffset) {
  const auto tokens = iota_tokens(24);
  insert_and_free(tokens);
  prune(tokens, 1, 5, 1);  // blocks 1-4 keep one page: 3 blocks unresident
  auto longer = iota_tokens(33);
  auto match = cache_.match_prefix(longer);
  ASSERT_EQ(match.num_blocks(), 6);
  cache_.lock(match.last_node());
  PageTable table(&pool_, small_layout());
  ASSERT_TRUE(table.attach_prefix(match.pages, match.num_resident_blocks, 3 * 4).is_ok());
  EXPECT_EQ(table.num_logical_tokens(), 24);
  EXPECT_EQ(table.num_tokens(0, 0), 12);
  ASSERT_TRUE(table.append(9).is_ok());  // positions 24..32: blocks 6, 7 are whole
  const std::vector<int32_t> block6 = {table.pages(0, 0)[3], table.pages(1, 1)[3]};
  auto inserted = cache_.insert(longer, table.view(), /*num_unresident_blocks=*/3);
  ASSERT_TRUE(inserted.is_ok()) << inserted.status().to_string();
  EXPECT_EQ(inserted->num_cached_blocks, 6);
  EXPECT_EQ(inserted->num_new_blocks, 2);
  cache_.lock(inserted->last_node);
  cache_.unlock(match.last_node());
  const auto again = cache_.peek_prefix(longer);
  ASSERT_EQ(again.num_blocks(), 8);
  ASSERT_EQ(again.num_resident_blocks, 5);
  EXPECT_EQ(again.pages[3], block6[0]);          // stream 0, resident block #3 = block 6
  EXPECT_EQ(again.pages[3 * 5 + 3], block6[1]);  // stream 3 = (layer 1, head 1)
  EXPECT_TRUE(table.check_integrity().is_ok());
  cache_.unlock(inserted->last_node);
  table.free_all();
  expect_intact();
}

TEST_F(PrefixPruneTest, NoBranchGrowsInsideASegment) {
  const auto tokens = iota_tokens(24);
  insert_and_free(tokens);
  prune(tokens, 1, 5, 1);
  auto diverging = iota_tokens(24);
  diverging[9] = 999;  // block 2, inside the segment
  PageTable table(&pool_, small_layout());
  ASSERT_TRUE(table.append(24).is_ok());
  auto inserted = cache_.insert(diverging, table.view());
  ASSERT_TRUE(inserted.is_ok());
  EXPECT_EQ(inserted->num_new_blocks, 0);  // stops under the inner node of block 1
  EXPECT_EQ(inserted->last_node,
            cache_.peek_prefix(tokens).nodes[0]);  // the lock stops before the segment
  EXPECT_EQ(cache_.num_nodes(), 6);
  table.free_all();
  expect_intact();
}

TEST_F(PrefixPruneTest, RefusesLockedOverlappingAndBranchingRanges) {
  const auto tokens = iota_tokens(24);
  insert_and_free(tokens);
  auto other = iota_tokens(24);
  other[14] = 999;  // a second continuation under block 2
  insert_and_free(other);
  // Branch: block 2 has two children, so it cannot be inside a segment...
  auto branched = cache_.prunable_nodes(tokens, 1, 5);
  EXPECT_EQ(branched.status().code(), StatusCode::kFailedPrecondition)
      << branched.status().to_string();
  // ...but a segment may end at it.
  EXPECT_TRUE(cache_.prunable_nodes(tokens, 1, 3).is_ok());
  // Locked by a running request: blocked.
  const auto match = cache_.match_prefix(iota_tokens(25));
  cache_.lock(match.last_node());
  auto locked = cache_.prunable_nodes(tokens, 0, 2);
  EXPECT_EQ(locked.status().code(), StatusCode::kUnavailable) << locked.status().to_string();
  cache_.unlock(match.last_node());
  // Not cached.
  EXPECT_EQ(cache_.prunable_nodes(iota_tokens(24, 1), 0, 2).status().code(),
            StatusCode::kFailedPrecondition);
  // Overlap with a pruned segment.
  prune(tokens, 0, 2, 1);
  EXPECT_EQ(cache_.prunable_nodes(tokens, 1, 3).status().code(), StatusCode::kFailedPrecondition);
  expect_intact();
}

TEST_F(PrefixPruneTest, EvictionRemovesASegmentAsAUnit) {
  const auto tokens = iota_tokens(24);
  insert_and_free(tokens);
  prune(tokens, 2, 6, 1);  // the segment ends at the leaf
  EXPECT_EQ(cache_.num_nodes(), 6);
  // One page is enough, yet the whole segment (its last node is the LRU leaf) goes.
  EXPECT_EQ(cache_.evict(1), kStreams);
  EXPECT_EQ(cache_.num_nodes(), 2);
  expect_intact();
  EXPECT_EQ(cache_.peek_prefix(tokens).num_blocks(), 2);
  EXPECT_EQ(cache_.evict(1000), 2 * kStreams);
  EXPECT_EQ(cache_.num_nodes(), 0);
  EXPECT_EQ(pool_.num_used_pages(), 0);
  expect_intact();
}

TEST_F(PrefixPruneTest, KeepingNoPageLeavesOnlyTheLogicalBlocks) {
  const auto tokens = iota_tokens(16);
  insert_and_free(tokens);
  EXPECT_EQ(prune(tokens, 0, 3, 0), 3 * kStreams);
  const auto match = cache_.match_prefix(iota_tokens(17));
  EXPECT_EQ(match.num_cached_tokens, 16);
  EXPECT_EQ(match.num_resident_blocks, 1);
  expect_intact();
}

TEST_F(PrefixPruneTest, LockedSegmentIsNotEvicted) {
  const auto tokens = iota_tokens(24);
  insert_and_free(tokens);
  prune(tokens, 2, 6, 1);
  const auto match = cache_.match_prefix(iota_tokens(25));
  ASSERT_EQ(match.num_blocks(), 6);
  cache_.lock(match.last_node());
  EXPECT_EQ(cache_.num_evictable_pages(), 0);
  EXPECT_EQ(cache_.evict(1000), 0);
  cache_.unlock(match.last_node());
  expect_intact();
}

}  // namespace
}  // namespace se
