#include "kv/page_table.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace se {
namespace {

// 2 layers x 2 KV heads = 4 streams, 4-token pages.
KvLayout small_layout() {
  return KvLayout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 2, .page_size = 4, .dtype = DType::kF32};
}

void expect_intact(const BlockPool& pool, const PageTable& table) {
  Status s = pool.check_integrity();
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  s = table.check_integrity();
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(PageTableTest, AppendAllocatesPagesForEveryStream) {
  BlockPool pool(64);
  PageTable table(&pool, small_layout());
  EXPECT_EQ(table.num_pages_for_append(5), 8);
  ASSERT_TRUE(table.append(5).is_ok());
  EXPECT_EQ(table.num_logical_tokens(), 5);
  EXPECT_EQ(table.num_held_pages(), 8);
  EXPECT_EQ(pool.num_used_pages(), 8);
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t head = 0; head < 2; ++head) {
      EXPECT_EQ(table.num_tokens(layer, head), 5);
      EXPECT_EQ(table.num_pages(layer, head), 2);
    }
  }
  // Pages of different streams are distinct.
  std::vector<int32_t> all;
  for (int32_t s = 0; s < 4; ++s) {
    auto p = table.pages(s / 2, s % 2);
    all.insert(all.end(), p.begin(), p.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());

  const PageSlot slot = table.slot(1, 1, 4);
  EXPECT_EQ(slot.page_id, table.pages(1, 1)[1]);
  EXPECT_EQ(slot.offset, 0);
  EXPECT_EQ(table.slot(0, 1, 3).offset, 3);

  // Filling the partial page allocates nothing.
  EXPECT_EQ(table.num_pages_for_append(3), 0);
  ASSERT_TRUE(table.append(3).is_ok());
  EXPECT_EQ(pool.num_used_pages(), 8);
  EXPECT_EQ(table.num_pages_for_append(1), 4);
  EXPECT_TRUE(table.append(0).is_ok());
  EXPECT_EQ(table.append(-2).code(), StatusCode::kInvalidArgument);
  expect_intact(pool, table);
}

TEST(PageTableTest, AppendIsAllOrNothing) {
  BlockPool pool(6);
  PageTable table(&pool, small_layout());
  const Status s = table.append(5);  // needs 8 pages
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("appending 5 tokens"), std::string::npos) << s.message();
  EXPECT_EQ(table.num_logical_tokens(), 0);
  EXPECT_EQ(table.num_held_pages(), 0);
  EXPECT_EQ(pool.num_free_pages(), 6);
  expect_intact(pool, table);
}

TEST(PageTableTest, TruncateReleasesPagesPastTheCut) {
  BlockPool pool(64);
  PageTable table(&pool, small_layout());
  ASSERT_TRUE(table.append(10).is_ok());  // 3 pages a stream
  EXPECT_EQ(pool.num_used_pages(), 12);
  ASSERT_TRUE(table.truncate(4).is_ok());
  EXPECT_EQ(table.num_logical_tokens(), 4);
  EXPECT_EQ(table.num_tokens(1, 0), 4);
  EXPECT_EQ(pool.num_used_pages(), 4);
  EXPECT_EQ(table.truncate(5).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(table.truncate(-1).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(table.append(2).is_ok());
  EXPECT_EQ(table.num_logical_tokens(), 6);
  expect_intact(pool, table);
  ASSERT_TRUE(table.truncate(0).is_ok());
  EXPECT_EQ(pool.num_free_pages(), 64);
  expect_intact(pool, table);
}

TEST(PageTableTest, SharedPrefixPagesSurviveTheFirstFree) {
  BlockPool pool(64);
  PageTable a(&pool, small_layout());
  ASSERT_TRUE(a.append(9).is_ok());  // 2 full blocks + 1 token
  // Stream-major [4 streams][2 blocks] as RadixCache::PrefixMatch lays it out.
  std::vector<int32_t> prefix;
  for (int32_t s = 0; s < 4; ++s) {
    auto p = a.pages(s / 2, s % 2);
    prefix.insert(prefix.end(), p.begin(), p.begin() + 2);
  }
  PageTable b(&pool, small_layout());
  ASSERT_TRUE(b.attach_prefix(prefix, 2).is_ok());
  EXPECT_EQ(b.num_logical_tokens(), 8);
  EXPECT_EQ(b.num_tokens(1, 1), 8);
  EXPECT_EQ(pool.ref_count(prefix[0]), 2);
  EXPECT_EQ(b.pages(1, 0)[1], prefix[2 * 2 + 1]);
  expect_intact(pool, b);

  ASSERT_TRUE(b.append(1).is_ok());  // into a fresh page: the shared ones are full
  EXPECT_EQ(pool.num_used_pages(), 12 + 4);
  a.free_all();
  EXPECT_EQ(pool.num_used_pages(), 12);  // b still holds the prefix and its own tail
  EXPECT_EQ(pool.ref_count(prefix[0]), 1);
  expect_intact(pool, b);
  b.free_all();
  EXPECT_EQ(pool.num_free_pages(), 64);
  expect_intact(pool, b);
}

TEST(PageTableTest, AttachPrefixChecksItsInput) {
  BlockPool pool(64);
  PageTable a(&pool, small_layout());
  ASSERT_TRUE(a.append(4).is_ok());
  std::vector<int32_t> prefix;
  prefix.reserve(4);
  for (int32_t s = 0; s < 4; ++s) prefix.push_back(a.pages(s / 2, s % 2)[0]);

  PageTable b(&pool, small_layout());
  EXPECT_EQ(b.attach_prefix(prefix, 2).code(), StatusCode::kInvalidArgument);     // 4 ids for 8
  EXPECT_EQ(a.attach_prefix(prefix, 1).code(), StatusCode::kFailedPrecondition);  // not empty
  a.free_all();
  const Status stale = b.attach_prefix(prefix, 1);
  EXPECT_EQ(stale.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("not in use"), std::string::npos);
  EXPECT_TRUE(b.attach_prefix({}, 0).is_ok());
  EXPECT_EQ(pool.num_free_pages(), 64);
  expect_intact(pool, b);
}

TEST(PageTableTest, WritesIntoPartiallyFilledSharedPagesAreRefused) {
  BlockPool pool(64);
  PageTable a(&pool, small_layout());
  ASSERT_TRUE(a.append(8).is_ok());
  std::vector<int32_t> prefix;
  for (int32_t s = 0; s < 4; ++s) {
    auto p = a.pages(s / 2, s % 2);
    prefix.insert(prefix.end(), p.begin(), p.end());
  }
  PageTable b(&pool, small_layout());
  ASSERT_TRUE(b.attach_prefix(prefix, 2).is_ok());
  // Cutting inside a shared page would let the next append overwrite tokens that a still reads.
  EXPECT_EQ(b.truncate(6).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.num_logical_tokens(), 8);
  ASSERT_TRUE(b.truncate(4).is_ok());  // a page boundary is fine
  EXPECT_EQ(pool.ref_count(prefix[1]), 1);
  expect_intact(pool, b);

  // A shared partial page (here left by shrinking a stream of an attached prefix) blocks appends to that stream.
  PageTable c(&pool, small_layout());
  ASSERT_TRUE(c.attach_prefix(prefix, 2).is_ok());
  ASSERT_TRUE(c.shrink_stream(0, 0, 2).is_ok());
  EXPECT_EQ(c.append(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.num_logical_tokens(), 8);
  expect_intact(pool, c);
}

TEST(PageTableTest, ShrinkStreamDropsOneHeadsTail) {
  BlockPool pool(64);
  PageTable table(&pool, small_layout());
  ASSERT_TRUE(table.append(12).is_ok());  // 3 pages a stream
  const std::vector<int32_t> old_pages(table.pages(0, 1).begin(), table.pages(0, 1).end());
  const uint64_t epoch = table.epoch();
  ASSERT_TRUE(table.shrink_stream(0, 1, 11).is_ok());  // inside the last page: no page goes
  EXPECT_EQ(table.epoch(), epoch);
  EXPECT_EQ(pool.num_used_pages(), 12);
  ASSERT_TRUE(table.shrink_stream(0, 1, 3).is_ok());
  EXPECT_NE(table.epoch(), epoch);
  EXPECT_EQ(table.num_tokens(0, 1), 3);
  EXPECT_EQ(table.num_tokens(0, 0), 12);
  EXPECT_EQ(table.num_logical_tokens(), 12);
  EXPECT_EQ(pool.ref_count(old_pages[0]), 1);
  EXPECT_EQ(pool.ref_count(old_pages[1]), 0);
  EXPECT_EQ(pool.ref_count(old_pages[2]), 0);
  EXPECT_EQ(pool.num_used_pages(), 10);
  expect_intact(pool, table);

  // Appending keeps counting logical positions while streams grow from their own lengths.
  ASSERT_TRUE(table.append(1).is_ok());
  EXPECT_EQ(table.num_tokens(0, 1), 4);
  EXPECT_EQ(table.num_logical_tokens(), 13);
  EXPECT_EQ(table.num_pages(0, 0), 4);
  EXPECT_EQ(table.num_pages(0, 1), 1);
  expect_intact(pool, table);
}

// The ring of a decode-time eviction at a page boundary: every stream one token into a fresh page drops its last
// slot, then the next step appends one token. The emptied pages stay as spares and come back in place, so no page
// changes hands and the epoch holds.
TEST(PageTableTest, DropLastSlotKeepsTheEmptiedPageForTheNextAppend) {
  BlockPool pool(64);
  PageTable table(&pool, small_layout());
  ASSERT_TRUE(table.append(9).is_ok());  // 3 pages a stream, the third holding one token
  const std::vector<int32_t> before(table.pages(1, 0).begin(), table.pages(1, 0).end());
  const uint64_t epoch = table.epoch();
  for (int32_t s = 0; s < 4; ++s) ASSERT_TRUE(table.drop_last_slot(s / 2, s % 2).is_ok());
  EXPECT_EQ(table.num_tokens(1, 0), 8);
  EXPECT_EQ(table.num_pages(1, 0), 2);
  EXPECT_EQ(table.spare_page(1, 0), before[2]);
  EXPECT_EQ(table.num_held_pages(), 12);
  EXPECT_EQ(pool.num_used_pages(), 12);
  EXPECT_EQ(table.epoch(), epoch);
  expect_intact(pool, table);

  EXPECT_EQ(table.num_pages_for_append(1), 0);
  EXPECT_EQ(table.num_pages_for_append(5), 4);  // the spare, then one fresh page a stream
  ASSERT_TRUE(table.append(1).is_ok());
  EXPECT_EQ(std::vector<int32_t>(table.pages(1, 0).begin(), table.pages(1, 0).end()), before);
  EXPECT_EQ(table.spare_page(1, 0), -1);
  EXPECT_EQ(pool.num_used_pages(), 12);
  EXPECT_EQ(table.epoch(), epoch);
  expect_intact(pool, table);

  // A slot dropped inside a page empties none; a shrink past the spare returns it with the tail.
  ASSERT_TRUE(table.drop_last_slot(0, 0).is_ok());  // 9 -> 8 tokens, spare: the third page
  ASSERT_TRUE(table.drop_last_slot(0, 0).is_ok());  // 8 -> 7: no page emptied
  EXPECT_EQ(table.num_pages(0, 0), 2);
  EXPECT_GE(table.spare_page(0, 0), 0);
  ASSERT_TRUE(table.shrink_stream(0, 0, 3).is_ok());
  EXPECT_EQ(table.spare_page(0, 0), -1);
  EXPECT_NE(table.epoch(), epoch);
  EXPECT_EQ(pool.num_used_pages(), 10);
  expect_intact(pool, table);

  // free_all returns the spares too.
  ASSERT_TRUE(table.append(4).is_ok());  // (0, 1): 13 tokens, one in a fresh fourth page
  ASSERT_TRUE(table.drop_last_slot(0, 1).is_ok());
  EXPECT_GE(table.spare_page(0, 1), 0);
  table.free_all();
  EXPECT_EQ(table.spare_page(0, 1), -1);
  EXPECT_EQ(pool.num_used_pages(), 0);
  expect_intact(pool, table);
}

TEST(PageTableTest, DropLastSlotOfASharedPageReleasesIt) {
  BlockPool pool(64);
  PageTable table(&pool, small_layout());
  ASSERT_TRUE(table.append(5).is_ok());  // the second page of each stream holds one token
  PageTable copy = table.clone();
  const uint64_t epoch = table.epoch();
  ASSERT_TRUE(table.drop_last_slot(0, 0).is_ok());
  EXPECT_EQ(table.spare_page(0, 0), -1);
  EXPECT_NE(table.epoch(), epoch);  // the entry may be listed again as another page
  EXPECT_EQ(table.num_pages(0, 0), 1);
  EXPECT_EQ(pool.num_used_pages(), 8);  // the copy still holds it
  expect_intact(pool, table);
  expect_intact(pool, copy);
  PageTable empty(&pool, small_layout());
  EXPECT_EQ(empty.drop_last_slot(0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.drop_last_slot(2, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(empty.drop_last_slot(0, -1).code(), StatusCode::kInvalidArgument);
}

TEST(PageTableTest, ShrinkStreamChecksItsInput) {
  BlockPool pool(64);
  PageTable table(&pool, small_layout());
  ASSERT_TRUE(table.append(6).is_ok());
  EXPECT_EQ(table.shrink_stream(2, 0, 6).code(), StatusCode::kInvalidArgument);   // no layer 2
  EXPECT_EQ(table.shrink_stream(1, 1, 7).code(), StatusCode::kInvalidArgument);   // grows
  EXPECT_EQ(table.shrink_stream(1, 1, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(table.num_tokens(1, 1), 6);
  ASSERT_TRUE(table.shrink_stream(1, 1, 0).is_ok());
  EXPECT_EQ(table.num_pages(1, 1), 0);
  expect_intact(pool, table);
}

TEST(PageTableTest, ViewExposesEachStreamsPages) {
  BlockPool pool(64);
  PageTable table(&pool, small_layout());
  ASSERT_TRUE(table.append(7).is_ok());
  ASSERT_TRUE(table.shrink_stream(1, 0, 2).is_ok());
  const PageTableView view = table.view();
  EXPECT_EQ(view.num_streams, 4);
  EXPECT_EQ(view.page_size, 4);
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t head = 0; head < 2; ++head) {
      ASSERT_EQ(view.length(layer, head), table.num_tokens(layer, head));
      ASSERT_EQ(view.num_pages(layer, head), table.num_pages(layer, head));
      for (int32_t i = 0; i < view.num_pages(layer, head); ++i) {
        EXPECT_EQ(view.pages(layer, head)[i], table.pages(layer, head)[i]);
      }
    }
  }
  EXPECT_EQ(view.length(1, 0), 2);
}

TEST(PageTableTest, MoveTransfersTheReferences) {
  BlockPool pool(64);
  PageTable a(&pool, small_layout());
  ASSERT_TRUE(a.append(5).is_ok());
  PageTable b(std::move(a));
  EXPECT_EQ(b.num_held_pages(), 8);
  EXPECT_EQ(pool.num_used_pages(), 8);
  PageTable c(&pool, small_layout());
  ASSERT_TRUE(c.append(1).is_ok());
  c = std::move(b);  // c's own pages are released first
  EXPECT_EQ(pool.num_used_pages(), 8);
  { PageTable d(std::move(c)); }
  EXPECT_EQ(pool.num_free_pages(), 64);
  EXPECT_TRUE(pool.check_integrity().is_ok());
}

TEST(PageTableTest, LongContextNeedsNoPerTokenMetadata) {
  // 128K tokens of a 32-layer, 8-KV-head model in 16-token pages: 256 streams x 8192 pages.
  const KvLayout layout{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .page_size = 16};
  BlockPool pool(static_cast<int32_t>(layout.pages_for_tokens(131072)));
  PageTable table(&pool, layout);
  table.reserve(131072);
  const size_t reserved = table.metadata_bytes();
  EXPECT_LE(reserved, 256u * (8192 + 2) * 4 + 64);  // the page lists, a length and a spare per stream
  // Decode-style single-token appends then one large chunk: metadata never grows past the
  // reservation.
  for (int i = 0; i < 2048; ++i) ASSERT_TRUE(table.append(1).is_ok());
  ASSERT_TRUE(table.append(131072 - 2048).is_ok());
  EXPECT_EQ(table.metadata_bytes(), reserved);
  EXPECT_EQ(table.num_held_pages(), 256 * 8192);
  EXPECT_EQ(pool.num_free_pages(), 0);
  EXPECT_EQ(table.slot(31, 7, 131071).offset, 15);
  table.free_all();
  EXPECT_EQ(pool.num_free_pages(), pool.num_total_pages());
}

}  // namespace
}  // namespace se
