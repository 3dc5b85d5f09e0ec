#include "kv/radix_cache.h"

#include <gtest/gtest.h>

#include "radix_cache_fixture.h"

namespace se {
namespace {

using test::iota_tokens;
using test::small_layout;
using RadixCacheTest = test::RadixCacheFixture;

TEST(HashBlockTest, ChainsTheParentHash) {
  const auto block = iota_tokens(4);
  EXPECT_EQ(hash_block(1, block), hash_block(1, block));
  EXPECT_NE(hash_block(1, block), hash_block(2, block));
  EXPECT_NE(hash_block(1, block), hash_block(1, iota_tokens(4, 1)));
}

TEST_F(RadixCacheTest, EmptyCacheMatchesNothing) {
  const auto match = cache_.match_prefix(iota_tokens(20));
  EXPECT_EQ(match.num_cached_tokens, 0);
  EXPECT_EQ(match.last_node(), RadixCache::kRootNode);
  EXPECT_TRUE(match.pages.empty());
  EXPECT_EQ(cache_.num_query_tokens(), 20);
  EXPECT_EQ(cache_.num_hit_tokens(), 0);
  cache_.lock(match.last_node());  // the root: no-op
  cache_.unlock(match.last_node());
  expect_intact();
}

TEST_F(RadixCacheTest, InsertThenMatchWholeBlocks) {
  const auto tokens = iota_tokens(14);  // 3 full blocks + 2 tokens
  PageTable table = filled_table(14);
  auto inserted = cache_.insert(tokens, table.view());
  ASSERT_TRUE(inserted.is_ok());
  EXPECT_EQ(inserted->num_new_blocks, 3);
  EXPECT_EQ(inserted->num_cached_blocks, 0);
  EXPECT_EQ(cache_.num_nodes(), 3);
  EXPECT_EQ(cache_.num_cached_pages(), 12);
  EXPECT_EQ(pool_.ref_count(table.pages(0, 0)[0]), 2);
  EXPECT_EQ(pool_.ref_count(table.pages(0, 0)[3]), 1);  // the partial block stays out
  expect_intact();

  std::vector<int32_t> expected_pages;  // [4 streams][3 blocks]
  for (int32_t s = 0; s < 4; ++s) {
    auto p = table.pages(s / 2, s % 2);
    expected_pages.insert(expected_pages.end(), p.begin(), p.begin() + 3);
  }
  table.free_all();
  EXPECT_EQ(pool_.num_used_pages(), 12);

  auto match = cache_.match_prefix(iota_tokens(13));
  EXPECT_EQ(match.num_cached_tokens, 12);
  EXPECT_EQ(match.num_blocks(), 3);
  EXPECT_EQ(match.last_node(), inserted->last_node);
  EXPECT_EQ(match.pages, expected_pages);
  // Never the whole prompt: 12 tokens match at most 2 blocks, leaving a block to compute.
  EXPECT_EQ(cache_.match_prefix(iota_tokens(12)).num_cached_tokens, 8);
  EXPECT_EQ(cache_.match_prefix(iota_tokens(4)).num_cached_tokens, 0);
  EXPECT_EQ(cache_.match_prefix({}).num_cached_tokens, 0);
  EXPECT_EQ(cache_.num_query_tokens(), 13 + 12 + 4);
  EXPECT_EQ(cache_.num_hit_tokens(), 12 + 8);
  expect_intact();
}

TEST_F(RadixCacheTest, MatchStopsWhereTheTokensDiverge) {
  insert_and_free(iota_tokens(12));
  auto tokens = iota_tokens(12);
  tokens[5] = 99;  // inside the second block
  tokens.push_back(0);
  EXPECT_EQ(cache_.match_prefix(tokens).num_cached_tokens, 4);
  // The same block under a different parent is a different node.
  EXPECT_EQ(cache_.match_prefix(iota_tokens(9, 4)).num_cached_tokens, 0);
  expect_intact();
}

TEST_F(RadixCacheTest, DuplicateBlocksKeepTheCachedPages) {
  const auto tokens = iota_tokens(8);
  PageTable a = filled_table(8);
  PageTable b = filled_table(8);
  ASSERT_TRUE(cache_.insert(tokens, a.view()).is_ok());
  auto second = cache_.insert(tokens, b.view());
  ASSERT_TRUE(second.is_ok());
  EXPECT_EQ(second->num_new_blocks, 0);
  EXPECT_EQ(second->num_cached_blocks, 2);
  EXPECT_EQ(pool_.ref_count(b.pages(1, 1)[0]), 1);  // b's copy stays b's alone
  EXPECT_EQ(pool_.ref_count(a.pages(1, 1)[0]), 2);
  b.free_all();  // releases the duplicates
  a.free_all();
  EXPECT_EQ(pool_.num_used_pages(), 8);
  auto match = cache_.match_prefix(iota_tokens(9));
  EXPECT_EQ(match.num_cached_tokens, 8);
  expect_intact();
}

TEST_F(RadixCacheTest, ExtendingACachedPrefixAddsOnlyTheNewBlocks) {
  insert_and_free(iota_tokens(8));
  // The next turn attaches the cached prefix, computes the rest and inserts the longer sequence.
  auto match = cache_.match_prefix(iota_tokens(17));
  ASSERT_EQ(match.num_blocks(), 2);
  cache_.lock(match.last_node());
  PageTable table(&pool_, small_layout());
  ASSERT_TRUE(table.attach_prefix(match.pages, match.num_blocks()).is_ok());
  ASSERT_TRUE(table.append(9).is_ok());
  auto inserted = cache_.insert(iota_tokens(17), table.view());
  ASSERT_TRUE(inserted.is_ok());
  EXPECT_EQ(inserted->num_cached_blocks, 2);
  EXPECT_EQ(inserted->num_new_blocks, 2);
  EXPECT_EQ(cache_.num_nodes(), 4);
  cache_.unlock(match.last_node());
  table.free_all();
  EXPECT_EQ(pool_.num_used_pages(), 16);
  expect_intact();
}

TEST_F(RadixCacheTest, LockedPathsAreNotEvicted) {
  insert_and_free(iota_tokens(12));
  auto match = cache_.match_prefix(iota_tokens(9));  // 2 of the 3 blocks
  cache_.lock(match.last_node());
  cache_.lock(match.last_node());  // locks nest
  EXPECT_EQ(cache_.num_evictable_pages(), 4);
  expect_intact();
  // Only the unlocked third block can go.
  EXPECT_EQ(cache_.evict(1000), 4);
  EXPECT_EQ(cache_.num_nodes(), 2);
  EXPECT_EQ(cache_.evict(1000), 0);
  cache_.unlock(match.last_node());
  EXPECT_EQ(cache_.evict(1000), 0);
  cache_.unlock(match.last_node());
  expect_intact();
  EXPECT_EQ(cache_.num_evictable_pages(), 8);
  EXPECT_EQ(cache_.evict(1000), 8);
  EXPECT_EQ(pool_.num_free_pages(), pool_.num_total_pages());
  expect_intact();
}

TEST_F(RadixCacheTest, EvictionFollowsLeastRecentUse) {
  const auto a = iota_tokens(8, 0);
  const auto b = iota_tokens(8, 100);
  const auto c = iota_tokens(8, 200);
  insert_and_free(a);
  insert_and_free(b);
  insert_and_free(c);
  auto probe = a;
  probe.push_back(0);
  EXPECT_EQ(cache_.match_prefix(probe).num_cached_tokens, 8);  // a is now the most recent
  // One leaf (4 pages) at a time: b's second block, then b's first (now a leaf), then c's second.
  EXPECT_EQ(cache_.evict(8), 8);
  auto probe_b = b;
  probe_b.push_back(0);
  EXPECT_EQ(cache_.match_prefix(probe_b).num_cached_tokens, 0);
  EXPECT_EQ(cache_.num_nodes(), 4);
  EXPECT_EQ(cache_.evict(4), 4);
  auto probe_c = c;
  probe_c.push_back(0);
  EXPECT_EQ(cache_.match_prefix(probe_c).num_cached_tokens, 4);
  EXPECT_EQ(cache_.match_prefix(probe).num_cached_tokens, 8);
  EXPECT_EQ(cache_.evict(0), 0);
  expect_intact();
}

TEST_F(RadixCacheTest, EvictingPagesOthersHoldFreesNothingForThem) {
  PageTable table = filled_table(8);
  ASSERT_TRUE(cache_.insert(iota_tokens(8), table.view()).is_ok());
  // The nodes are idle but the table still holds every page: dropping them frees no memory.
  EXPECT_EQ(cache_.evict(4), 0);
  EXPECT_EQ(cache_.num_nodes(), 0);
  EXPECT_EQ(pool_.num_used_pages(), 8);
  expect_intact();
}

TEST_F(RadixCacheTest, InsertChecksThePageTable) {
  PageTable short_table = filled_table(6);
  auto too_short = cache_.insert(iota_tokens(8), short_table.view());
  EXPECT_EQ(too_short.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_short.status().message().find("holds 6 tokens"), std::string::npos);

  BlockPool other_pool(64);
  PageTable other(&other_pool,
                  KvLayout{.num_layers = 1, .num_kv_heads = 2, .head_dim = 2, .page_size = 4});
  ASSERT_TRUE(other.append(8).is_ok());
  EXPECT_EQ(cache_.insert(iota_tokens(8), other.view()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_.num_nodes(), 0);
  // Fewer than a block caches nothing.
  auto nothing = cache_.insert(iota_tokens(3), short_table.view());
  ASSERT_TRUE(nothing.is_ok());
  EXPECT_EQ(nothing->num_new_blocks, 0);
  EXPECT_EQ(nothing->last_node, RadixCache::kRootNode);
  expect_intact();
}

TEST_F(RadixCacheTest, InsertedPathCanBeLockedWhileTheRequestRuns) {
  PageTable table = filled_table(8);
  auto inserted = cache_.insert(iota_tokens(8), table.view());
  ASSERT_TRUE(inserted.is_ok());
  cache_.lock(inserted->last_node);
  table.free_all();
  EXPECT_EQ(cache_.evict(100), 0);
  cache_.unlock(inserted->last_node);
  EXPECT_EQ(cache_.evict(100), 8);
  expect_intact();
}

TEST_F(RadixCacheTest, DestructionReleasesEverything) {
  {
    RadixCache cache(&pool_, small_layout());
    PageTable table = filled_table(16);
    ASSERT_TRUE(cache.insert(iota_tokens(16), table.view()).is_ok());
  }
  EXPECT_EQ(pool_.num_free_pages(), pool_.num_total_pages());
}

TEST_F(RadixCacheTest, NodeSlotsAreReusedAfterEviction) {
  for (int round = 0; round < 5; ++round) {
    insert_and_free(iota_tokens(16, round * 1000));
    EXPECT_EQ(cache_.evict(1000), 16);
    expect_intact();
  }
  EXPECT_EQ(cache_.num_nodes(), 0);
  EXPECT_EQ(pool_.num_free_pages(), pool_.num_total_pages());
}

}  // namespace
}  // namespace se
