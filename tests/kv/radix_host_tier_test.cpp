// The radix cache's host tier: evicted blocks move to a host pool and stay matchable; a match brings them back
// (byte for byte), an insert passing them gives them the sequence's own pages, a full tier drops its oldest
// leaves, and pages a node shares stay with their other holder. Both pools and the cache are checked after every
// operation.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../support/page_pools.h"
#include "kv/radix_cache.h"
#include "radix_cache_fixture.h"

namespace se {
namespace {

using test::iota_tokens;
using test::small_layout;

class RadixHostTierTest : public ::testing::Test {
 protected:
  void expect_intact() {
    for (const Status& s : {device_.check_integrity(), host_.check_integrity(), cache_.check_integrity()})
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(cache_.num_host_pages(), host_.num_used_pages());
  }
  // A table of `tokens`' KV whose page bytes say which token block and stream they hold.
  PageTable table_of(const std::vector<int32_t>& tokens) {
    PageTable table(&device_, small_layout());
    EXPECT_TRUE(table.append(static_cast<int32_t>(tokens.size())).is_ok());
    const PageTableView view = table.view();
    for (int32_t s = 0; s < view.num_streams; ++s)
      for (int32_t p = 0; p * view.page_size < view.num_tokens[s]; ++p)
        fill(device_.storage()->page(view.page_ids[s * view.stride + p]), tokens[static_cast<size_t>(p) * 4], s);
    return table;
  }
  static void fill(void* page, int32_t first_token, int32_t stream) {
    auto* bytes = static_cast<uint8_t*>(page);
    for (size_t b = 0; b < small_layout().page_bytes(); ++b)
      bytes[b] = static_cast<uint8_t>(first_token * 31 + stream * 7 + static_cast<int32_t>(b));
  }
  void insert_and_free(const std::vector<int32_t>& tokens) {
    PageTable table = table_of(tokens);
    ASSERT_TRUE(cache_.insert(tokens, table.view()).is_ok());
  }
  // The match's pages hold the bytes table_of wrote for its blocks.
  void expect_bytes_of(const RadixCache::PrefixMatch& match, const std::vector<int32_t>& tokens) {
    std::vector<uint8_t> want(small_layout().page_bytes());
    const int32_t n = match.num_resident_blocks;
    for (int32_t s = 0; s < small_layout().num_streams(); ++s)
      for (int32_t b = 0; b < n; ++b) {
        fill(want.data(), tokens[static_cast<size_t>(b) * 4], s);
        const int32_t page = match.pages[static_cast<size_t>(s) * static_cast<size_t>(n) + static_cast<size_t>(b)];
        EXPECT_EQ(std::memcmp(device_.storage()->page(page), want.data(), want.size()), 0)
            << "stream " << s << " block " << b;
      }
  }

  BlockPool device_ = test::pool_with_storage(small_layout(), 24);  // 6 blocks of 4 streams
  BlockPool host_ = test::pool_with_storage(small_layout(), 16);    // 4 blocks
  RadixCache cache_{&device_, small_layout(), &host_};
};

TEST_F(RadixHostTierTest, EvictedBlocksMoveToTheHostAndAMatchBringsThemBack) {
  const std::vector<int32_t> tokens = iota_tokens(13);
  insert_and_free(iota_tokens(12));
  expect_intact();
  EXPECT_EQ(cache_.evict(12), 12);
  EXPECT_EQ(device_.num_used_pages(), 0);
  EXPECT_EQ(cache_.num_host_pages(), 12);
  EXPECT_EQ(cache_.num_nodes(), 3);
  EXPECT_EQ(cache_.num_evictable_pages(), 0);
  EXPECT_EQ(cache_.peek_prefix(tokens).num_cached_tokens, 12);
  expect_intact();

  const RadixCache::PrefixMatch match = cache_.match_prefix(tokens);
  EXPECT_EQ(match.num_cached_tokens, 12);
  EXPECT_EQ(match.num_resident_blocks, 3);
  expect_bytes_of(match, tokens);
  EXPECT_EQ(cache_.num_host_pages(), 0);
  EXPECT_EQ(device_.num_used_pages(), 12);
  expect_intact();
}

TEST_F(RadixHostTierTest, AFullHostTierDropsItsOldestLeaves) {
  const std::vector<int32_t> a = iota_tokens(8), b = iota_tokens(8, 100), c = iota_tokens(8, 200);
  for (const auto* tokens : {&a, &b, &c}) insert_and_free(*tokens);
  EXPECT_EQ(cache_.evict(24), 24);  // six blocks for a tier of four: "a", the oldest, goes
  EXPECT_EQ(cache_.num_host_pages(), 16);
  EXPECT_EQ(cache_.peek_prefix(a).num_cached_tokens, 0);
  EXPECT_EQ(cache_.peek_prefix(b).num_cached_tokens, 8);
  EXPECT_EQ(cache_.peek_prefix(c).num_cached_tokens, 8);
  expect_intact();
  std::vector<int32_t> prompt = c;
  prompt.push_back(0);
  const RadixCache::PrefixMatch match = cache_.match_prefix(prompt);
  EXPECT_EQ(match.num_cached_tokens, 8);
  expect_bytes_of(match, c);
  expect_intact();
}

TEST_F(RadixHostTierTest, PagesANodeSharesStayWithTheirOtherHolder) {
  const std::vector<int32_t> tokens = iota_tokens(8);
  PageTable table = table_of(tokens);  // the sequence keeps holding its pages
  ASSERT_TRUE(cache_.insert(tokens, table.view()).is_ok());
  EXPECT_EQ(cache_.evict(8), 0);  // moved to the host, but the sequence still holds the device pages
  EXPECT_EQ(cache_.num_host_pages(), 8);
  for (int32_t page : table.pages(0, 0)) EXPECT_EQ(device_.ref_count(page), 1);
  expect_intact();
  std::vector<int32_t> prompt = tokens;
  prompt.push_back(0);
  const RadixCache::PrefixMatch match = cache_.match_prefix(prompt);
  ASSERT_EQ(match.num_resident_blocks, 2);
  EXPECT_NE(match.pages[0], table.pages(0, 0)[0]);  // new device pages with the same bytes
  expect_bytes_of(match, tokens);
  EXPECT_EQ(device_.num_used_pages(), 16);
  expect_intact();
  table.free_all();
  EXPECT_EQ(device_.num_used_pages(), 8);
  expect_intact();
}

TEST_F(RadixHostTierTest, AnInsertPassingAHostNodeGivesItTheSequencesPages) {
  insert_and_free(iota_tokens(8));
  cache_.evict(8);
  PageTable table = table_of(iota_tokens(12));
  auto inserted = cache_.insert(iota_tokens(12), table.view());
  ASSERT_TRUE(inserted.is_ok()) << inserted.status().to_string();
  EXPECT_EQ(inserted->num_cached_blocks, 2);
  EXPECT_EQ(inserted->num_new_blocks, 1);
  EXPECT_EQ(cache_.num_host_pages(), 0);
  for (int32_t page : table.pages(0, 0)) EXPECT_EQ(device_.ref_count(page), 2);
  expect_intact();
}

TEST_F(RadixHostTierTest, AMatchStopsBeforeTheBlocksThatFindNoRoom) {
  insert_and_free(iota_tokens(16));
  EXPECT_EQ(cache_.evict(16), 16);
  PageTable others = table_of(iota_tokens(20, 500));  // 20 of the 24 device pages, not cached
  const RadixCache::PrefixMatch match = cache_.match_prefix(iota_tokens(17));
  EXPECT_EQ(match.num_cached_tokens, 4);  // one block fits; the rest stay on the host
  EXPECT_EQ(cache_.num_host_pages(), 12);
  expect_bytes_of(match, iota_tokens(17));
  expect_intact();
}

TEST_F(RadixHostTierTest, RandomInsertsMatchesLocksAndEvictionsKeepBothPoolsWhole) {
  std::mt19937 rng(17);
  std::vector<RadixCache::NodeId> locked;
  for (int op = 0; op < 2000; ++op) {
    // Prompts over a tiny alphabet share prefixes often.
    std::vector<int32_t> tokens(static_cast<size_t>(4 + rng() % 16));
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 3);
    switch (rng() % 4) {
      case 0:
        if (device_.num_free_pages() >= small_layout().pages_for_tokens(static_cast<int64_t>(tokens.size())))
          insert_and_free(tokens);
        break;
      case 1: {
        const RadixCache::PrefixMatch match = cache_.match_prefix(tokens);
        expect_bytes_of(match, tokens);
        if (match.num_blocks() > 0 && locked.size() < 3) {
          cache_.lock(match.last_node());
          locked.push_back(match.last_node());
        }
        break;
      }
      case 2:
        if (!locked.empty()) {
          cache_.unlock(locked.back());
          locked.pop_back();
        }
        break;
      default:
        cache_.evict(static_cast<int32_t>(rng() % 12));
        break;
    }
    ASSERT_NO_FATAL_FAILURE(expect_intact()) << "after operation " << op;
  }
  for (RadixCache::NodeId node : locked) cache_.unlock(node);
  cache_.evict(1000);
  EXPECT_EQ(device_.num_used_pages(), 0);
  expect_intact();
}

}  // namespace
}  // namespace se
