// Prefix pruning through the paged cache manager, with real KV bytes: the kept positions' K/V land, in order,
// in the pages of the segment's first blocks; a request on the same tokens reuses the pruned prefix; a prune of
// blocks a running request holds is refused and changes nothing.
#include <gtest/gtest.h>

#include <numeric>

#include "sparse/paged_cache_manager.h"

namespace se {
namespace {

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 2, kPageSize = 4;

KvLayout small_layout() {
  return KvLayout{.num_layers = kLayers, .num_kv_heads = kKvHeads, .head_dim = kHeadDim, .page_size = kPageSize,
                  .dtype = DType::kF32};
}

std::vector<int32_t> iota_tokens(int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 100);
  return t;
}

// The value every element of (layer, head, position, K or V) holds: recognizable after any move.
float tag(int layer, int head, int32_t position, int kv) {
  return static_cast<float>(position * 1000 + layer * 100 + head * 10 + kv);
}

class PagedPruneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cache = PagedCacheManager::create(small_layout(), 64, cpu_allocator(), /*enable_prefix_caching=*/true);
    ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
    cache_ = std::move(*cache);
  }
  void expect_intact() {
    const Status s = cache_->check_integrity();
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  // Computes `tokens` in sequence `seq` (tagging the K/V of every new position) and leaves them in the cache.
  void compute(int32_t seq, const std::vector<int32_t>& tokens) {
    auto cached = cache_->open(seq, tokens);
    ASSERT_TRUE(cached.is_ok()) << cached.status().to_string();
    const auto n = static_cast<int32_t>(tokens.size());
    const int32_t first_new = cache_->num_logical_tokens(seq);
    ASSERT_TRUE(cache_->reserve(seq, n - first_new).is_ok());
    for (int layer = 0; layer < kLayers; ++layer) {
      const AttentionView view = cache_->build_sequence_view(seq, layer);
      for (int h = 0; h < kKvHeads; ++h) {
        const int32_t length = cache_->stream_length(seq, layer, h);
        for (int32_t p = first_new; p < n; ++p) {
          const int32_t slot = length - (n - p);  // new tokens are the stream's last slots
          for (int kv = 0; kv < 2; ++kv) {
            float* e = view.element<float>(stored_page(view, h, slot), kv, slot % kPageSize);
            std::fill_n(e, kHeadDim, tag(layer, h, p, kv));
          }
        }
      }
    }
    cache_->on_computed(seq, tokens, n);
  }
  static int32_t stored_page(const AttentionView& view, int h, int32_t slot) {
    return view.seqs[0].page_ids[static_cast<int64_t>(h) * view.seqs[0].stride + slot / kPageSize];
  }
  // The tag of slot `slot` of (seq, layer, head), K.
  float stored_tag(int32_t seq, int layer, int h, int32_t slot) {
    const AttentionView view = cache_->build_sequence_view(seq, layer);
    return *view.element<float>(stored_page(view, h, slot), 0, slot % kPageSize);
  }

  std::unique_ptr<PagedCacheManager> cache_;
};

TEST_F(PagedPruneTest, KeptPositionsMoveInOrderAndThePrefixStillMatches) {
  const auto tokens = iota_tokens(25);  // 6 whole blocks
  compute(0, tokens);
  cache_->close(0);
  const int64_t free_before = cache_->num_free_pages();
  const RadixCache::BlockRange blocks{1, 5};  // positions [4, 20)
  ASSERT_TRUE(cache_->check_prunable(tokens, blocks).is_ok());
  const std::vector<int32_t> kept = {5, 6, 7, 9, 10, 17, 18, 19};  // two pages
  int rewritten_layers = 0;
  auto freed = cache_->prune_prefix(tokens, blocks, kept, [&](int layer, const AttentionView& view) {
    EXPECT_EQ(layer, rewritten_layers++);
    EXPECT_EQ(view.q_indptr[1] - view.q_indptr[0], 8);  // the rewritten tokens are the view's new rows
    EXPECT_EQ(view.seqs[0].num_tokens[0], 8);
  });
  ASSERT_TRUE(freed.is_ok()) << freed.status().to_string();
  EXPECT_EQ(*freed, 2 * kLayers * kKvHeads);
  EXPECT_EQ(rewritten_layers, kLayers);
  EXPECT_EQ(cache_->num_free_pages(), free_before + *freed);
  expect_intact();

  auto inspection = cache_->inspect_prefix(tokens);
  ASSERT_TRUE(inspection.is_ok());
  EXPECT_EQ(inspection->num_cached_tokens, 24);
  EXPECT_EQ(inspection->num_resident_blocks, 4);

  // A request on the same tokens plus more reuses the pruned prefix: 24 logical tokens, 16 resident.
  auto longer = iota_tokens(30);
  auto cached = cache_->open(1, longer);
  ASSERT_TRUE(cached.is_ok());
  EXPECT_EQ(*cached, 24);
  EXPECT_EQ(cache_->num_logical_tokens(1), 24);
  const std::vector<int32_t> resident = {0, 1, 2, 3, 5, 6, 7, 9, 10, 17, 18, 19, 20, 21, 22, 23};
  EXPECT_EQ(inspection->resident_positions, resident);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int h = 0; h < kKvHeads; ++h) {
      ASSERT_EQ(cache_->stream_length(1, layer, h), 16);
      const std::span<const int32_t> positions = cache_->slot_positions(1, layer, h);
      EXPECT_EQ(std::vector<int32_t>(positions.begin(), positions.end()), resident);
      for (int32_t slot = 0; slot < 16; ++slot)
        EXPECT_EQ(stored_tag(1, layer, h, slot), tag(layer, h, resident[static_cast<size_t>(slot)], 0))
            << "layer " << layer << " head " << h << " slot " << slot;
    }
  }
  // Its later blocks are cached after the pruned prefix, page-aligned, and match again.
  cache_->close(1);
  compute(2, longer);
  cache_->close(2);
  expect_intact();
  auto again = cache_->inspect_prefix(longer);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->num_cached_tokens, 28);
  EXPECT_EQ(again->num_resident_blocks, 5);
  ASSERT_TRUE(cache_->open(3, longer).is_ok());
  EXPECT_EQ(stored_tag(3, 1, 1, 16), tag(1, 1, 24, 0));  // block 6 right after the kept KV
  cache_->close(3);
  expect_intact();
}

TEST_F(PagedPruneTest, PruneOfBlocksInUseChangesNothing) {
  const auto tokens = iota_tokens(25);
  compute(0, tokens);
  cache_->close(0);
  ASSERT_TRUE(cache_->open(1, tokens).is_ok());  // holds the 6 cached blocks
  const int64_t free_before = cache_->num_free_pages();
  EXPECT_EQ(cache_->check_prunable(tokens, {1, 5}).code(), StatusCode::kUnavailable);
  auto freed = cache_->prune_prefix(tokens, {1, 5}, std::vector<int32_t>{4, 5, 6, 7}, {});
  EXPECT_EQ(freed.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(cache_->num_free_pages(), free_before);
  for (int32_t slot = 0; slot < 24; ++slot) EXPECT_EQ(stored_tag(1, 1, 0, slot), tag(1, 0, slot, 0));
  cache_->close(1);
  auto inspection = cache_->inspect_prefix(tokens);
  ASSERT_TRUE(inspection.is_ok());
  EXPECT_EQ(inspection->num_resident_blocks, 6);
  EXPECT_TRUE(inspection->pruned_segments.empty());
  expect_intact();
}

TEST_F(PagedPruneTest, RejectsKeptPositionsThatAreNotWholePagesInsideTheBlocks) {
  const auto tokens = iota_tokens(25);
  compute(0, tokens);
  cache_->close(0);
  EXPECT_FALSE(cache_->prune_prefix(tokens, {1, 5}, std::vector<int32_t>{4, 5, 6}, {}).is_ok());
  EXPECT_FALSE(cache_->prune_prefix(tokens, {1, 5}, std::vector<int32_t>{0, 5, 6, 7}, {}).is_ok());
  EXPECT_FALSE(cache_->prune_prefix(tokens, {1, 5}, std::vector<int32_t>{7, 6, 5, 4}, {}).is_ok());
  auto inspection = cache_->inspect_prefix(tokens);
  ASSERT_TRUE(inspection.is_ok());
  EXPECT_EQ(inspection->num_resident_blocks, 6);
  expect_intact();
}

}  // namespace
}  // namespace se
