#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kv/kv_layout.h"
#include "kv/page_storage.h"

namespace se {
namespace {

void expect_intact(const BlockPool& pool) {
  const Status s = pool.check_integrity();
  EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(KvLayoutTest, PageBytesAndStreams) {
  KvLayout layout{
      .num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .page_size = 16, .dtype = DType::kBF16};
  ASSERT_TRUE(layout.validate().is_ok());
  EXPECT_EQ(layout.num_streams(), 256);
  EXPECT_EQ(layout.stream(3, 5), 29);
  EXPECT_EQ(layout.page_bytes(), 2u * 16 * 128 * 2);
  EXPECT_EQ(layout.element_offset(1, 3), (16u + 3u) * 128u);
  EXPECT_EQ(layout.pages_per_stream(0), 0);
  EXPECT_EQ(layout.pages_per_stream(17), 2);
  EXPECT_EQ(layout.pages_for_tokens(131072), 256 * 8192);
}

TEST(KvLayoutTest, ValidateNamesTheBadField) {
  KvLayout layout{.num_layers = 2, .num_kv_heads = 0, .head_dim = 64};
  Status s = layout.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_kv_heads"), std::string::npos) << s.message();
  layout.num_kv_heads = 2;
  layout.page_size = 0;
  EXPECT_NE(layout.validate().message().find("page_size"), std::string::npos);
  layout.page_size = 16;
  layout.dtype = DType::kI32;
  EXPECT_NE(layout.validate().message().find("dtype"), std::string::npos);
}

TEST(KvLayoutTest, PagesThatFit) {
  KvLayout layout{
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .page_size = 16, .dtype = DType::kF16};
  // 2 * 16 * 64 * 2 = 4096 bytes a page.
  EXPECT_EQ(num_pages_that_fit(layout, 4096 * 10 + 4095).value(), 10);
  EXPECT_EQ(num_pages_that_fit(layout, 100).value(), 0);
  EXPECT_EQ(num_pages_that_fit(layout, size_t{1} << 62).value(), 2147483647);
  layout.head_dim = -1;
  EXPECT_EQ(num_pages_that_fit(layout, 4096).status().code(), StatusCode::kInvalidArgument);
}

TEST(BlockPoolTest, FreshPoolHandsOutIdsInOrder) {
  BlockPool pool(5);
  EXPECT_EQ(pool.num_total_pages(), 5);
  EXPECT_EQ(pool.num_free_pages(), 5);
  auto pages = pool.allocate(3);
  ASSERT_TRUE(pages.is_ok());
  EXPECT_EQ(*pages, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.num_free_pages(), 2);
  EXPECT_EQ(pool.num_used_pages(), 3);
  EXPECT_EQ(pool.ref_count(1), 1);
  EXPECT_EQ(pool.ref_count(4), 0);
  EXPECT_TRUE(pool.allocate(0)->empty());
  expect_intact(pool);
}

TEST(BlockPoolTest, AllocateIsAllOrNothing) {
  BlockPool pool(4);
  ASSERT_TRUE(pool.allocate(2).is_ok());
  auto too_many = pool.allocate(3);
  ASSERT_FALSE(too_many.is_ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_many.status().message().find("3 pages requested, 2 free"), std::string::npos);
  EXPECT_EQ(pool.num_free_pages(), 2);
  EXPECT_EQ(pool.allocate(-1).status().code(), StatusCode::kInvalidArgument);
  expect_intact(pool);
}

TEST(BlockPoolTest, FreedPagesJoinTheBackOfTheQueue) {
  BlockPool pool(4);
  ASSERT_TRUE(pool.allocate(4).is_ok());
  EXPECT_TRUE(pool.release(2));
  EXPECT_TRUE(pool.release(0));
  expect_intact(pool);
  // The least recently freed page is reused first.
  EXPECT_EQ(*pool.allocate(1), std::vector<int32_t>{2});
  EXPECT_EQ(*pool.allocate(1), std::vector<int32_t>{0});
  EXPECT_EQ(pool.num_free_pages(), 0);
  expect_intact(pool);
}

TEST(BlockPoolTest, ReferenceCountsKeepSharedPagesUsed) {
  BlockPool pool(3);
  const int32_t id = pool.allocate(1)->front();
  pool.retain(id);
  pool.retain(id);
  EXPECT_EQ(pool.ref_count(id), 3);
  EXPECT_FALSE(pool.release(id));
  EXPECT_FALSE(pool.release(id));
  EXPECT_EQ(pool.num_used_pages(), 1);
  expect_intact(pool);
  EXPECT_TRUE(pool.release(id));
  EXPECT_EQ(pool.num_free_pages(), 3);
  expect_intact(pool);
}

TEST(BlockPoolTest, ReleaseSpanCountsFreedPages) {
  BlockPool pool(4);
  auto pages = *pool.allocate(3);
  pool.retain(pages[1]);
  EXPECT_EQ(pool.release(pages), 2);
  EXPECT_EQ(pool.ref_count(pages[1]), 1);
  expect_intact(pool);
}

TEST(BlockPoolTest, TakeRemovesAPageFromTheMiddleOfTheQueue) {
  BlockPool pool(5);
  ASSERT_TRUE(pool.take(2).is_ok());
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(pool.num_free_pages(), 4);
  expect_intact(pool);
  ASSERT_TRUE(pool.take(4).is_ok());  // the tail
  ASSERT_TRUE(pool.take(0).is_ok());  // the head
  expect_intact(pool);
  EXPECT_EQ(*pool.allocate(2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(pool.take(2).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.take(9).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.take(-1).code(), StatusCode::kInvalidArgument);
  expect_intact(pool);
}

TEST(BlockPoolTest, EmptyPool) {
  BlockPool pool(0);
  EXPECT_EQ(pool.allocate(1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.allocate(0).is_ok());
  expect_intact(pool);
}

TEST(BlockPoolDeathTest, ReleasingAFreePageIsABug) {
  BlockPool pool(2);
  EXPECT_DEATH(pool.release(1), "not in use");
  EXPECT_DEATH(pool.retain(0), "not in use");
}

TEST(PageStorageTest, ArenaMapsIdsToDisjointPages) {
  KvLayout layout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .page_size = 4, .dtype = DType::kF32};
  auto storage = ArenaPageStorage::create(cpu_allocator(), 6, layout.page_bytes());
  ASSERT_TRUE(storage.is_ok()) << storage.status().to_string();
  BlockPool pool(std::move(storage).value());
  ASSERT_NE(pool.storage(), nullptr);
  EXPECT_EQ(pool.num_total_pages(), 6);
  EXPECT_EQ(pool.storage()->page_bytes(), 256u);
  EXPECT_EQ(pool.storage()->device(), Device::kCpu);
  for (int32_t p = 0; p < 6; ++p) {
    std::memset(pool.storage()->page(p), p + 1, pool.storage()->page_bytes());
  }
  for (int32_t p = 0; p < 6; ++p) {
    const auto* bytes = static_cast<const unsigned char*>(pool.storage()->page(p));
    EXPECT_EQ(bytes[0], p + 1);
    EXPECT_EQ(bytes[255], p + 1);
  }
  EXPECT_EQ(
      static_cast<char*>(pool.storage()->page(5)) - static_cast<char*>(pool.storage()->base()),
      5 * 256);
  expect_intact(pool);
}

TEST(PageStorageTest, CreateRejectsBadSizes) {
  EXPECT_EQ(ArenaPageStorage::create(nullptr, 4, 64).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ArenaPageStorage::create(cpu_allocator(), 0, 64).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ArenaPageStorage::create(cpu_allocator(), 4, 0).status().code(),
            StatusCode::kInvalidArgument);
  auto huge = ArenaPageStorage::create(cpu_allocator(), 1 << 30, size_t{1} << 40);
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("overflow"), std::string::npos);
}

}  // namespace
}  // namespace se
