// Two-level page metadata: the bytes it keeps on the device at 128K against flat per-page bounds (hand-computed
// figures for the Llama-3.1-8B shape), and its kept sets against flat Quest's (the page ranking op) on random keys:
// the same with every group kept; with few groups, a difference only where a page flat Quest keeps sits in a group
// the coarse level passed over, and how often that is.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "sparse/quest_two_level_index.h"

namespace se {
namespace {

TEST(QuestTwoLevelIndexTest, MetadataBytesAt128K) {
  // Llama-3.1-8B: 32 layers x 8 KV heads, head_dim 128, bf16 bounds, 16-token pages; 131072 tokens = 8192 pages.
  const KvLayout llama{.num_layers = 32, .num_kv_heads = 8, .head_dim = 128, .page_size = 16, .dtype = DType::kBF16};
  const PageBoundBytes flat = flat_page_bound_bytes(llama, 131072);
  EXPECT_EQ(flat.device, int64_t{256} * 8192 * 512);  // 256 streams x 8192 pages x (2 x 128 x 2 bytes) = 1 GiB
  EXPECT_EQ(flat.host, 0);
  const PageBoundBytes two_level = two_level_page_bound_bytes(llama, 131072, 16);
  EXPECT_EQ(two_level.device, int64_t{256} * 512 * 512);  // 512 groups of 16 pages per stream: 64 MiB
  EXPECT_EQ(two_level.host, flat.device);                 // the fine bounds, all of them, on the host
  // A partial last page and a partial last group both count whole.
  const PageBoundBytes odd = two_level_page_bound_bytes(llama, 131072 + 1, 16);
  EXPECT_EQ(odd.device, int64_t{256} * 513 * 512);
  EXPECT_EQ(odd.host, int64_t{256} * 8193 * 512);
}

struct Stream {
  int32_t num_pages = 0;
  std::vector<float> fine;  // [num_pages, 2, D]
  std::vector<float> q;     // [group_heads, D]
};

constexpr int32_t kHeadDim = 16;
constexpr int32_t kGroupHeads = 2;
constexpr int32_t kPageSize = 4;

// Pages of random keys around a per-page centre (nearby keys share a page, as in a real stream), and a query.
Stream random_stream(std::mt19937& rng) {
  Stream s;
  s.num_pages = 10 + static_cast<int32_t>(rng() % 190);
  std::normal_distribution<float> normal;
  s.fine.resize(static_cast<size_t>(s.num_pages) * 2 * kHeadDim);
  for (int32_t p = 0; p < s.num_pages; ++p) {
    float* lo = s.fine.data() + static_cast<size_t>(p) * 2 * kHeadDim;
    float* hi = lo + kHeadDim;
    for (int32_t d = 0; d < kHeadDim; ++d) {
      const float centre = normal(rng);
      lo[d] = hi[d] = centre + 0.3f * normal(rng);
      for (int32_t t = 1; t < kPageSize; ++t) {
        const float k = centre + 0.3f * normal(rng);
        lo[d] = std::min(lo[d], k);
        hi[d] = std::max(hi[d], k);
      }
    }
  }
  s.q.resize(static_cast<size_t>(kGroupHeads) * kHeadDim);
  for (float& x : s.q) x = normal(rng);
  return s;
}

// Flat Quest's choice: the page ranking op over the stream's bounds.
std::vector<int32_t> flat_quest(const Stream& s, int32_t page_budget) {
  std::vector<int32_t> page_ids(static_cast<size_t>(s.num_pages));
  for (int32_t p = 0; p < s.num_pages; ++p) page_ids[static_cast<size_t>(p)] = p;
  const int32_t num_tokens = s.num_pages * kPageSize;
  const std::vector<int32_t> q_indptr = {0, 1};
  SeqKvView sv;
  sv.page_ids = page_ids.data();
  sv.stride = s.num_pages;
  sv.num_tokens = &num_tokens;
  AttentionView view;
  view.page_size = kPageSize;
  view.head_dim = kHeadDim;
  view.num_kv_heads = 1;
  view.num_seqs = 1;
  view.q_indptr = q_indptr.data();
  view.seqs = &sv;
  std::vector<int32_t> lists(static_cast<size_t>(page_budget));
  int32_t count = 0;
  std::vector<float> bounds = s.fine;
  std::vector<float> q = s.q;
  select_pages_by_key_bounds(TensorView{lists.data(), DType::kI32, Shape{1, 1, page_budget}},
                             TensorView{&count, DType::kI32, Shape{1, 1}},
                             TensorView{q.data(), DType::kF32, Shape{1, kGroupHeads, kHeadDim}},
                             TensorView{bounds.data(), DType::kF32, Shape{s.num_pages, 2, kHeadDim}}, view, page_budget,
                             s.num_pages, GroupReduce::kMean);
  lists.resize(static_cast<size_t>(count));
  return lists;
}

std::vector<int32_t> two_level(const Stream& s, int32_t page_budget, const TwoLevelConfig& config,
                               int64_t* num_fine_read = nullptr) {
  const int32_t num_groups = (s.num_pages - 1 + config.group_size - 1) / config.group_size;
  std::vector<float> coarse(static_cast<size_t>(std::max(num_groups, 1)) * 2 * kHeadDim);
  summarize_page_groups(s.fine, s.num_pages - 1, kHeadDim, config.group_size, coarse);
  return select_pages_two_level(s.q, kGroupHeads, coarse, s.fine, s.num_pages, kHeadDim, page_budget,
                                GroupReduce::kMean, config, num_fine_read);
}

TEST(QuestTwoLevelIndexTest, AGroupSummaryIsItsPagesElementwiseMinAndMax) {
  std::mt19937 rng(34);
  const Stream s = random_stream(rng);
  const int32_t num_candidates = s.num_pages - 1, group_size = 8;
  const int32_t num_groups = (num_candidates + group_size - 1) / group_size;
  std::vector<float> coarse(static_cast<size_t>(num_groups) * 2 * kHeadDim);
  summarize_page_groups(s.fine, num_candidates, kHeadDim, group_size, coarse);
  for (int32_t g = 0; g < num_groups; ++g) {
    for (int32_t d = 0; d < kHeadDim; ++d) {
      float lo = s.fine[static_cast<size_t>(g * group_size) * 2 * kHeadDim + d], hi = lo;
      for (int32_t p = g * group_size; p < std::min((g + 1) * group_size, num_candidates); ++p) {
        lo = std::min(lo, s.fine[static_cast<size_t>(p) * 2 * kHeadDim + d]);
        hi = std::max(hi, s.fine[static_cast<size_t>(p) * 2 * kHeadDim + kHeadDim + d]);
      }
      EXPECT_EQ(coarse[static_cast<size_t>(g) * 2 * kHeadDim + d], lo) << "group " << g;
      EXPECT_EQ(coarse[static_cast<size_t>(g) * 2 * kHeadDim + kHeadDim + d], hi) << "group " << g;
    }
  }
}

TEST(QuestTwoLevelIndexTest, EveryGroupKeptIsFlatQuest) {
  std::mt19937 rng(35);
  for (int trial = 0; trial < 300; ++trial) {
    const Stream s = random_stream(rng);
    const int32_t budget = 2 + static_cast<int32_t>(rng() % 15);
    const TwoLevelConfig all{.group_size = 8, .num_groups_kept = 1 << 20};
    EXPECT_EQ(two_level(s, budget, all), flat_quest(s, budget)) << "trial " << trial;
  }
}

TEST(QuestTwoLevelIndexTest, FewGroupsKeptMissOnlyPagesOfGroupsPassedOver) {
  std::mt19937 rng(36);
  constexpr int kTrials = 1000;
  const TwoLevelConfig config{.group_size = 8, .num_groups_kept = 4};
  int differing = 0;
  int64_t flat_pages = 0, missed_pages = 0, fine_read = 0, fine_total = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const Stream s = random_stream(rng);
    const int32_t budget = 8;
    const std::vector<int32_t> flat = flat_quest(s, budget);
    const std::vector<int32_t> got = two_level(s, budget, config, &fine_read);
    fine_total += s.num_pages - 1;
    ASSERT_EQ(got.size(), flat.size()) << "trial " << trial;
    ASSERT_EQ(got.back(), s.num_pages - 1) << "the last page is always read";
    ASSERT_TRUE(std::is_sorted(got.begin(), got.end()));
    if (got == flat) continue;
    ++differing;
    flat_pages += static_cast<int64_t>(flat.size());
    // A page flat Quest keeps and the two-level choice lacks lies in a group the coarse level passed over: no page
    // of that group (but the always-read last one) was chosen, since a kept group ranks all its pages.
    for (int32_t page : flat) {
      if (std::binary_search(got.begin(), got.end(), page)) continue;
      ++missed_pages;
      for (int32_t other : got)
        ASSERT_FALSE(other != s.num_pages - 1 && other / config.group_size == page / config.group_size)
            << "trial " << trial << ": page " << page << " missed though its group was kept";
    }
  }
  // Random keys spread the best pages over many groups: the coarse level misses some of them in most streams
  // longer than its kept groups, and reads a fraction of the fine bounds.
  EXPECT_GT(differing, 0);
  EXPECT_LT(fine_read, fine_total);
  std::printf(
      "two-level (groups of %d, %d kept) vs flat Quest, budget 8: %d of %d kept sets differ, %lld of their "
      "%lld pages missed; %.1f%% of the fine bounds read\n",
      config.group_size, config.num_groups_kept, differing, kTrials, static_cast<long long>(missed_pages),
      static_cast<long long>(flat_pages), 100.0 * static_cast<double>(fine_read) / static_cast<double>(fine_total));
}

}  // namespace
}  // namespace se
