// The snapkv_global scoring pass on the tiny model: on top of the engine's cached prefix it gives the scores of
// the scratch sequence that recomputes everything, leaves the cache as it was (no page taken, nothing inserted or
// locked), and on a pruned prefix scores what the prefix keeps (the positions it dropped never win).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../support/tiny_model.h"
#include "engine/prune_scoring.h"
#include "sparse/methods/vanilla.h"
#include "sparse/paged_cache_manager.h"
#include "sparse/sparse_controller.h"

namespace se {
namespace {

constexpr int kPageSize = 4;

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % 96);
  return t;
}

class PruneScoringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelConfig& c = model_.config();
    KvLayout layout{c.num_layers, c.num_kv_heads, c.head_dim, kPageSize, DType::kF32};
    auto cache = PagedCacheManager::create(layout, 512, cpu_allocator(), /*enable_prefix_caching=*/true);
    ASSERT_TRUE(cache.is_ok());
    cache_ = std::move(*cache);
  }
  // Prefills `tokens` as a request would and leaves its whole blocks in the radix cache.
  void cache_prompt(const std::vector<int32_t>& tokens) {
    auto vanilla = VanillaMethod::create(nullptr);
    ASSERT_TRUE(vanilla.is_ok());
    SparseController controller(**vanilla, *cache_);
    ASSERT_TRUE(controller.open(0, tokens).is_ok());
    const auto n = static_cast<int32_t>(tokens.size());
    ASSERT_TRUE(cache_->reserve(0, n).is_ok());
    ForwardBatch batch;
    batch.token_ids = tokens;
    for (int32_t i = 0; i < n; ++i) batch.positions.push_back(i);
    batch.sequences = {{0, 0, n, n}};
    batch.logit_rows = {n - 1};
    ForwardWorkspace workspace = model_.make_workspace();
    (void)model_.forward(batch, controller, workspace);
    cache_->on_computed(0, tokens, n);
    controller.close(0);
  }
  PruneScoringOptions options(bool on_cache) {
    PruneScoringOptions o;
    o.window = 8;
    o.page_size = kPageSize;
    o.cache = on_cache ? cache_.get() : nullptr;
    return o;
  }
  static void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < got.size(); ++j) {
      if (std::isinf(want[j])) {
        EXPECT_TRUE(std::isinf(got[j])) << j;
      } else {
        EXPECT_NEAR(got[j], want[j], 1e-4f * std::max(1.0f, std::abs(want[j]))) << j;
      }
    }
  }

  Model model_ = test::tiny_model();
  std::unique_ptr<PagedCacheManager> cache_;
};

TEST_F(PruneScoringTest, ScoresOnTheCachedPrefixEqualAFullRecompute) {
  const auto tokens = random_tokens(61, 3);
  cache_prompt(tokens);
  const int64_t free_before = cache_->num_free_pages();
  const int64_t hits_before = cache_->prefix_cache_counters().hit_tokens;
  auto on_cache = score_positions(model_, tokens, options(true));
  ASSERT_TRUE(on_cache.is_ok()) << on_cache.status().to_string();
  // It reused the cached prefix (whole blocks before the window)...
  EXPECT_EQ(cache_->prefix_cache_counters().hit_tokens - hits_before, (61 - 8) / kPageSize * kPageSize);
  // ...and gave everything back.
  EXPECT_EQ(cache_->num_free_pages(), free_before);
  EXPECT_EQ(cache_->inspect_prefix(tokens)->num_blocks(), 61 / kPageSize);
  EXPECT_TRUE(cache_->check_prunable(tokens, {0, 15}).is_ok());  // nothing stayed locked
  EXPECT_TRUE(cache_->check_integrity().is_ok());
  auto recomputed = score_positions(model_, tokens, options(false));
  ASSERT_TRUE(recomputed.is_ok()) << recomputed.status().to_string();
  expect_close(*on_cache, *recomputed);
}

TEST_F(PruneScoringTest, APrunedPrefixIsScoredOverWhatItKeeps) {
  const auto tokens = random_tokens(61, 4);
  cache_prompt(tokens);
  const std::vector<int32_t> kept = {9, 10, 17, 20};  // one page of the segment [8, 24)
  ASSERT_TRUE(cache_->prune_prefix(tokens, {2, 6}, kept, {}).is_ok());
  const int64_t hits_before = cache_->prefix_cache_counters().hit_tokens;
  const int64_t free_before = cache_->num_free_pages();
  auto scores = score_positions(model_, tokens, options(true));
  ASSERT_TRUE(scores.is_ok()) << scores.status().to_string();
  // The whole cached prefix before the window is attached, the pruned segment included...
  EXPECT_EQ(cache_->prefix_cache_counters().hit_tokens - hits_before, (61 - 8) / kPageSize * kPageSize);
  EXPECT_EQ(cache_->num_free_pages(), free_before);
  // ...so the positions it dropped score -inf, the kept ones and the rest a real score, the window +inf.
  for (int32_t j = 0; j < 61; ++j) {
    const float s = (*scores)[static_cast<size_t>(j)];
    const bool dropped = j >= 8 && j < 24 && std::find(kept.begin(), kept.end(), j) == kept.end();
    if (dropped) {
      EXPECT_TRUE(std::isinf(s) && s < 0) << j;
    } else if (j >= 61 - 8) {
      EXPECT_TRUE(std::isinf(s) && s > 0) << j;
    } else {
      EXPECT_TRUE(std::isfinite(s) && s > 0) << j;
    }
  }
  EXPECT_TRUE(cache_->check_integrity().is_ok());
}

TEST_F(PruneScoringTest, ASequenceNoLongerThanTheWindowCannotBeScored) {
  EXPECT_FALSE(score_positions(model_, random_tokens(8, 5), options(false)).is_ok());
  EXPECT_FALSE(score_positions(model_, random_tokens(8, 5), options(true)).is_ok());
}

}  // namespace
}  // namespace se
