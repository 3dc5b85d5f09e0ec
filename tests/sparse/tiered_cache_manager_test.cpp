// TieredCacheManager: the admission arithmetic of running sequences spread over the device pool and the host tier
// (working set, metadata pages, the two pools together), and a randomized run of opens, prefill chunks, decode steps
// and closes with check_integrity after each and both pools whole at the end, every layer's output checked against
// attention over the sequence's whole history (the budget covers every page, so Quest reads them all).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "../support/kv_store_steps.h"
#include "sparse/tiered_cache_manager.h"

namespace se {
namespace {

const KvLayout kLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .page_size = 4, .dtype = DType::kF32};
constexpr int32_t kNumHeads = 4;          // query heads: two per KV head
constexpr int32_t kTokenBudget = 32;      // 8 pages per KV head: a layer's selection is 16 pages
constexpr int32_t kMaxBatchedTokens = 8;  // a step's tokens at most

std::unique_ptr<TieredCacheManager> make_cache(int32_t device_pages, int32_t host_pages,
                                               const PartitionConfig& config = {.token_budget = kTokenBudget,
                                                                                .buffer_factor = 2}) {
  auto cache = TieredCacheManager::create(kLayout, device_pages, cpu_allocator(), host_pages, cpu_allocator(), config,
                                          kMaxBatchedTokens);
  SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
  return std::move(cache).value();
}

TEST(TieredCacheManagerTest, AdmitsAgainstTheWorkingSetOnTheDeviceAndTheKvOverBothPools) {
  const auto cache = make_cache(40, 200);
  // A page holds 4 streams' worth of bounds (64 bytes each of 256): the index of n pages per stream, to a power of
  // two, takes that many pages.
  EXPECT_EQ(cache->metadata_pages(0), 1);
  EXPECT_EQ(cache->metadata_pages(20), 8);
  EXPECT_EQ(cache->metadata_pages(33), 16);
  // A layer read whole (2 KV heads x 10 pages), or a step's new pages (4 streams x 3).
  EXPECT_EQ(cache->working_set_pages(40, 8), 20);
  EXPECT_EQ(cache->working_set_pages(4, 8), 12);
  // 100 tokens: a layer is 50 pages, more than the device pool.
  const Status wide = cache->check_can_ever_hold(100, 100);
  EXPECT_EQ(wide.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(wide.message().find("working set"), std::string::npos) << wide.to_string();
  // 60 tokens: a layer's 30 pages and 16 of metadata exceed 40.
  EXPECT_EQ(cache->check_can_ever_hold(60, 60).code(), StatusCode::kResourceExhausted);
  // 48 tokens: 24 + 16 pages on the device, and its 48 KV pages exceed the device pool alone.
  EXPECT_TRUE(cache->check_can_ever_hold(48, 48).is_ok());
  // With a host tier of 20 pages, 48 + 16 pages exceed the 40 + 20 less one layer's selection (16).
  const auto small_host = make_cache(40, 20);
  const Status both = small_host->check_can_ever_hold(48, 48);
  EXPECT_EQ(both.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(both.message().find("host tier"), std::string::npos) << both.to_string();
}

TEST(TieredCacheManagerTest, AStepWhoseWorkingSetOutgrowsTheDeviceIsRefusedAndChangesNothing) {
  // A budget of 2 pages: 4 pages kept free for a selection, so the pools have room long after the device has none
  // for the working set.
  const auto cache = make_cache(40, 200, {.token_budget = 8, .buffer_factor = 2});
  ASSERT_TRUE(cache->open(0, {}).is_ok());
  ASSERT_TRUE(cache->open(1, {}).is_ok());
  // Sequence 1 at 32 tokens: 8 metadata pages.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(cache->reserve(1, 8).is_ok());
  // Sequence 0 grows until its layer (2 x pages) and the two indexes no longer fit 40 pages.
  int32_t grown = 0;
  Status reserved;
  while ((reserved = cache->reserve(0, 4)).is_ok()) grown += 4;
  EXPECT_EQ(reserved.code(), StatusCode::kResourceExhausted) << reserved.to_string();
  EXPECT_EQ(grown, 32) << "36 tokens: a layer's 18 pages beside 8 + 16 pages of metadata exceed 40";
  EXPECT_EQ(cache->num_logical_tokens(0), 32);
  EXPECT_TRUE(cache->check_integrity().is_ok());
  cache->close(0);
  cache->close(1);
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
  EXPECT_EQ(cache->num_free_host_pages(), cache->num_host_pages());
  EXPECT_TRUE(cache->check_integrity().is_ok());
}

TEST(TieredCacheManagerTest, TheMethodsStateBesideThePoolIsHeldAsMetadataPagesAndParkedWithTheSequence) {
  // A method that selects its own tokens keeps no bounds; 64 bytes of state per page of every stream: a quarter of a
  // 256-byte page, so 4 streams' pages take one metadata page per page of a stream.
  const PartitionConfig config{.token_budget = 8,
                               .buffer_factor = 2,
                               .method_tokens = MethodTokens{.chunk_size = 4, .max_chunks = 2},
                               .state_bytes_per_page = 64};
  const auto cache = make_cache(40, 200, config);
  EXPECT_EQ(cache->metadata_pages(0), 0);
  EXPECT_EQ(cache->metadata_pages(20), 5);
  EXPECT_EQ(cache->metadata_pages(33), 9);
  // 48 tokens: a layer's 24 pages beside 12 of state fit 40; 64 tokens: 32 + 16 do not.
  EXPECT_TRUE(cache->check_can_ever_hold(48, 48).is_ok());
  EXPECT_EQ(cache->check_can_ever_hold(64, 64).code(), StatusCode::kResourceExhausted);

  ASSERT_TRUE(cache->open(0, {}).is_ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache->reserve(0, 6).is_ok());
  // 18 tokens: 5 pages per stream, 20 KV pages and 5 of state on the device.
  EXPECT_EQ(cache->num_held_pages(0), 25);
  EXPECT_EQ(cache->pages_to_reserve(0, 2), 0) << "20 tokens fill the streams' fifth pages";
  EXPECT_EQ(cache->pages_to_reserve(0, 4), 4 + 1) << "22 tokens: a sixth page in every stream, and its state";
  ASSERT_TRUE(cache->check_integrity().is_ok());

  // Parked, the sequence takes host pages for its KV only (the state goes with the method's snapshot) and gives
  // the device every page; restored, its state's pages come back before it steps again.
  std::unique_ptr<SequenceSnapshot> parked = cache->snapshot(0);
  EXPECT_EQ(parked->num_host_pages_short(), 0);
  ASSERT_TRUE(parked->offload().is_ok());
  EXPECT_TRUE(parked->is_offloaded());
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
  EXPECT_EQ(cache->num_free_host_pages(), cache->num_host_pages() - 20);
  EXPECT_EQ(parked->num_pages_to_restore(), 5);
  ASSERT_TRUE(cache->restore(0, std::move(parked)).is_ok());
  EXPECT_EQ(cache->num_used_pages(), 5);
  ASSERT_TRUE(cache->check_integrity().is_ok());
  ASSERT_TRUE(cache->reserve(0, 6).is_ok());
  ASSERT_TRUE(cache->check_integrity().is_ok());
  cache->close(0);
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
  EXPECT_EQ(cache->num_free_host_pages(), cache->num_host_pages());
}

// A sequence's K/V as written, per layer: [tokens][Hkv][D] each.
struct History {
  std::vector<std::vector<float>> k, v;
};

TEST(TieredCacheManagerTest, RandomStepsKeepBothPoolsWholeAndAttendOverTheWholeHistory) {
  std::mt19937 rng(35);
  // Sequences of up to 32 tokens (8 pages per stream, 32 pages each), 48 device pages, 160 host pages.
  const auto cache = make_cache(48, 160);
  std::map<int32_t, History> open;
  int32_t next_seq = 0;
  int64_t num_refused = 0, num_steps = 0, num_moved = 0;
  const AttentionParams params{.scale = 1.0f / std::sqrt(static_cast<float>(kLayout.head_dim))};
  for (int op = 0; op < 600; ++op) {
    const int choice = static_cast<int>(rng() % 10);
    if (open.empty() || (choice == 0 && open.size() < 5)) {
      const Result<int32_t> opened = cache->open(next_seq, {});
      if (opened.is_ok())
        open[next_seq] = History{std::vector<std::vector<float>>(2), std::vector<std::vector<float>>(2)};
      ++next_seq;
    } else if (choice == 1) {
      auto it = open.begin();
      std::advance(it, static_cast<int64_t>(rng() % open.size()));
      cache->close(it->first);
      open.erase(it);
    } else {
      auto it = open.begin();
      std::advance(it, static_cast<int64_t>(rng() % open.size()));
      const int32_t seq = it->first;
      const int32_t before = cache->num_logical_tokens(seq);
      // The first step prefills; later ones decode one token or prefill a chunk.
      const bool decode = before > 0 && rng() % 2 == 0;
      const int32_t n = decode ? 1 : 1 + static_cast<int32_t>(rng() % kMaxBatchedTokens);
      if (before + n > 32) {
        cache->close(seq);
        open.erase(it);
        ASSERT_TRUE(cache->check_integrity().is_ok());
        continue;
      }
      const Status reserved = cache->reserve(seq, n);
      if (!reserved.is_ok()) {
        ASSERT_EQ(reserved.code(), StatusCode::kResourceExhausted) << reserved.to_string();
        ASSERT_EQ(cache->num_logical_tokens(seq), before);
        ++num_refused;
        ASSERT_TRUE(cache->check_integrity().is_ok());
        continue;
      }
      History& history = it->second;
      for (int32_t layer = 0; layer < kLayout.num_layers; ++layer) {
        const Tensor q = test::random_kv_rows(rng, n, kNumHeads, kLayout.head_dim);
        const Tensor k = test::random_kv_rows(rng, n, kLayout.num_kv_heads, kLayout.head_dim);
        const Tensor v = test::random_kv_rows(rng, n, kLayout.num_kv_heads, kLayout.head_dim);
        Tensor out = Tensor::empty(DType::kF32, {n, kNumHeads, kLayout.head_dim});
        const Status attended = cache->attend(seq, layer, q.view(), k.view(), v.view(), out.view(), params,
                                              decode ? PartitionStep::kDecode : PartitionStep::kPrefill);
        ASSERT_TRUE(attended.is_ok()) << attended.to_string();
        auto& keys = history.k[static_cast<size_t>(layer)];
        auto& values = history.v[static_cast<size_t>(layer)];
        keys.insert(keys.end(), k.data<float>(), k.data<float>() + k.numel());
        values.insert(values.end(), v.data<float>(), v.data<float>() + v.numel());
        // The reference: attention over the whole history, held contiguously.
        const int32_t total = before + n;
        Tensor q_positions = Tensor::empty(DType::kI32, {n});
        Tensor k_positions = Tensor::empty(DType::kI32, {total});
        for (int32_t i = 0; i < n; ++i) q_positions.data<int32_t>()[i] = before + i;
        for (int32_t i = 0; i < total; ++i) k_positions.data<int32_t>()[i] = i;
        const TensorView all_k{keys.data(), DType::kF32, {total, kLayout.num_kv_heads, kLayout.head_dim}, Device::kCpu};
        const TensorView all_v{
            values.data(), DType::kF32, {total, kLayout.num_kv_heads, kLayout.head_dim}, Device::kCpu};
        Tensor want = Tensor::empty(DType::kF32, {n, kNumHeads, kLayout.head_dim});
        attention(want.view(), q.view(), all_k, all_v, q_positions.view(), k_positions.view(), params);
        for (int64_t i = 0; i < want.numel(); ++i)
          ASSERT_NEAR(out.data<float>()[i], want.data<float>()[i], 1e-5f)
              << "sequence " << seq << " layer " << layer << " element " << i;
      }
      num_moved += cache->step_counts(seq).num_retrieved_pages;
      ++num_steps;
    }
    ASSERT_TRUE(cache->check_integrity().is_ok()) << cache->check_integrity().to_string();
  }
  for (const auto& [seq, history] : open) cache->close(seq);
  EXPECT_TRUE(cache->check_integrity().is_ok());
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
  EXPECT_EQ(cache->num_free_host_pages(), cache->num_host_pages());
  EXPECT_GT(num_steps, 200);
  EXPECT_GT(num_moved, 0) << "pages came back from the host";
  EXPECT_GT(num_refused, 0) << "some steps found the device or the pools full";
}

}  // namespace
}  // namespace se
