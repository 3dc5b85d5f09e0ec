// The observation-window eviction methods (snapkv, pyramidkv, adakv, chunkkv): their config errors (unknown keys,
// out-of-range budget / window / kernel and method-specific keys), their defaults and traits, the shared scoring
// steps (pooling, group-reduction order, top-k ties), the budget rules (PyramidKV's kvpress and KVCache-Factory
// schedules, AdaKV's kvpress and FFY0 per-head splits, ChunkKV kept tokens) on hand-computed values, and their
// memory models.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sparse/method_registry.h"
#include "sparse/methods/adakv.h"
#include "sparse/methods/chunkkv.h"
#include "sparse/methods/observation_window_scores.h"
#include "sparse/methods/pyramidkv.h"
#include "base/top_k.h"

namespace se {
namespace {

const std::vector<std::string> kMethods = {"snapkv", "pyramidkv", "adakv", "chunkkv"};

// The error message of create_method(name, config), which must fail.
std::string error_of(const std::string& name, const nlohmann::json& config) {
  auto method = create_method(name, config);
  EXPECT_FALSE(method.is_ok()) << name << " accepted " << config.dump();
  return method.is_ok() ? "" : method.status().to_string();
}

TEST(ObservationWindowConfig, RejectsUnknownKeys) {
  for (const std::string& name : kMethods) {
    EXPECT_NE(error_of(name, {{"capacity", 1024}}).find("unknown --sparse-config key 'capacity'"), std::string::npos)
        << name;
    EXPECT_NE(error_of(name, {{"budget", 512}, {"window_size", 8}}).find("'window_size'"), std::string::npos) << name;
  }
  EXPECT_NE(error_of("snapkv", {{"beta", 20}}).find("'beta'"), std::string::npos);
  EXPECT_NE(error_of("snapkv", {{"chunk_length", 20}}).find("'chunk_length'"), std::string::npos);
  EXPECT_NE(error_of("pyramidkv", {{"floor_alpha", 0.2}}).find("'floor_alpha'"), std::string::npos);
  EXPECT_NE(error_of("adakv", {{"beta", 20}}).find("'beta'"), std::string::npos);
  EXPECT_NE(error_of("adakv", {{"schedule", "kvpress"}}).find("'schedule'"), std::string::npos);
  EXPECT_NE(error_of("pyramidkv", {{"variant", "kvpress"}}).find("'variant'"), std::string::npos);
  EXPECT_NE(error_of("pyramidkv", {{"schedule", "pyramid"}}).find("'schedule' must be one of kvpress, kvcache_factory"),
            std::string::npos);
  EXPECT_NE(error_of("adakv", {{"variant", "ffy0"}}).find("'variant' must be one of kvpress, adakv_reference"),
            std::string::npos);
  EXPECT_NE(error_of("chunkkv", {{"floor_alpha", 0.2}}).find("'floor_alpha'"), std::string::npos);
  EXPECT_NE(error_of("snapkv", nlohmann::json::array({1})).find("JSON object"), std::string::npos);
}

TEST(ObservationWindowConfig, RejectsOutOfRangeBudgetWindowAndKernel) {
  for (const std::string& name : kMethods) {
    EXPECT_NE(error_of(name, {{"budget", 0}}).find("'budget' = 0 is out of range"), std::string::npos) << name;
    EXPECT_NE(error_of(name, {{"budget", -8}}).find("'budget'"), std::string::npos) << name;
    if (name != "pyramidkv")
      EXPECT_NE(error_of(name, {{"budget", 100.5}}).find("'budget' must be an integer"), std::string::npos) << name;
    EXPECT_NE(error_of(name, {{"budget", int64_t{1} << 31}}).find("'budget'"), std::string::npos) << name;
    EXPECT_NE(error_of(name, {{"window", 0}}).find("'window' = 0 is out of range"), std::string::npos) << name;
    EXPECT_NE(error_of(name, {{"window", 1 << 17}}).find("'window'"), std::string::npos) << name;
    // The budget includes the window, so it must leave room to select something.
    EXPECT_NE(error_of(name, {{"budget", 64}, {"window", 64}}).find("must exceed 'window'"), std::string::npos)
        << name;
    EXPECT_NE(error_of(name, {{"budget", 16}, {"window", 32}}).find("must exceed 'window'"), std::string::npos)
        << name;
    EXPECT_NE(error_of(name, {{"kernel", 4}}).find("'kernel' = 4 must be odd"), std::string::npos) << name;
    EXPECT_NE(error_of(name, {{"kernel", 0}}).find("'kernel'"), std::string::npos) << name;
    EXPECT_NE(error_of(name, {{"pooling", "sumpool"}}).find("'pooling' must be one of"), std::string::npos) << name;
    EXPECT_NE(error_of(name, {{"gqa_agg", "median"}}).find("'gqa_agg'"), std::string::npos) << name;
    EXPECT_NE(error_of(name, {{"gqa_order", "before"}}).find("'gqa_order'"), std::string::npos) << name;
  }
  EXPECT_NE(error_of("pyramidkv", {{"beta", 0}}).find("'beta' = 0 is out of range"), std::string::npos);
  // pyramidkv's kvpress schedule takes a real budget (kvpress's T (1 - r)); KVCache-Factory's an integer one.
  EXPECT_NE(error_of("pyramidkv", {{"budget", 1.5}}).find("'budget' = 1.5 is out of range"), std::string::npos);
  EXPECT_NE(error_of("pyramidkv", {{"budget", 64.0}}).find("must exceed 'window'"), std::string::npos);
  EXPECT_NE(error_of("pyramidkv", {{"budget", 100.5}, {"schedule", "kvcache_factory"}}).find("must be an integer"),
            std::string::npos);
  auto fractional = create_method("pyramidkv", {{"budget", 388.5}});
  ASSERT_TRUE(fractional.is_ok()) << fractional.status().to_string();
  EXPECT_EQ((*fractional)->config()["budget"], 388.5);
  EXPECT_TRUE(create_method("pyramidkv", {{"budget", 64.5}}).is_ok());
  EXPECT_NE(error_of("adakv", {{"floor_alpha", 1.5}}).find("'floor_alpha'"), std::string::npos);
  EXPECT_NE(error_of("adakv", {{"floor_alpha", -0.1}}).find("'floor_alpha'"), std::string::npos);
  EXPECT_NE(error_of("chunkkv", {{"chunk_length", 0}}).find("'chunk_length' = 0 is out of range"),
            std::string::npos);
}

TEST(ObservationWindowConfig, DefaultsFollowTheirReferences) {
  struct Expected {
    std::string name;
    int window, kernel;
    std::string pooling, gqa_order;
  };
  for (const Expected& e : {Expected{"snapkv", 64, 5, "avgpool", "pool_then_reduce"},
                            Expected{"pyramidkv", 64, 5, "avgpool", "pool_then_reduce"},
                            Expected{"adakv", 64, 5, "avgpool", "pool_then_reduce"},
                            Expected{"chunkkv", 64, 5, "avgpool", "pool_then_reduce"}}) {
    auto method = create_method(e.name, nullptr);
    ASSERT_TRUE(method.is_ok()) << method.status().to_string();
    const nlohmann::ordered_json& c = (*method)->config();
    EXPECT_EQ(c["budget"], 2048) << e.name;
    EXPECT_EQ(c["window"], e.window) << e.name;
    EXPECT_EQ(c["kernel"], e.kernel) << e.name;
    EXPECT_EQ(c["pooling"], e.pooling) << e.name;
    EXPECT_EQ(c["gqa_agg"], "mean") << e.name;
    EXPECT_EQ(c["gqa_order"], e.gqa_order) << e.name;
    const MethodTraits& t = (*method)->traits();
    EXPECT_EQ(t.family, MethodFamily::kEviction);
    EXPECT_FALSE(t.keeps_full_history);
    EXPECT_EQ(t.ops, (std::vector<OpId>{OpId::kAttentionScores, OpId::kCompactKv, OpId::kMoveKvRows}));
    EXPECT_EQ(t.prefill_policy, PrefillPolicy::kCompressAfter);
  }
  EXPECT_EQ((*create_method("pyramidkv", nullptr))->config()["beta"], 20);
  EXPECT_EQ((*create_method("pyramidkv", nullptr))->config()["schedule"], "kvpress");
  EXPECT_TRUE((*create_method("pyramidkv", nullptr))->config()["budget"].is_number_integer());
  EXPECT_EQ((*create_method("adakv", nullptr))->config()["variant"], "kvpress");
  // FFY0's own scorer comes with its variant.
  auto reference = create_method("adakv", {{"variant", "adakv_reference"}});
  ASSERT_TRUE(reference.is_ok()) << reference.status().to_string();
  EXPECT_EQ((*reference)->config()["window"], 32);
  EXPECT_EQ((*reference)->config()["kernel"], 7);
  EXPECT_EQ((*reference)->config()["pooling"], "maxpool");
  EXPECT_EQ((*reference)->config()["gqa_order"], "reduce_then_pool");
  EXPECT_EQ((*reference)->config()["floor_alpha"], 0.2);
  EXPECT_EQ((*create_method("adakv", nullptr))->config()["floor_alpha"], 0.2);
  EXPECT_EQ((*create_method("chunkkv", nullptr))->config()["chunk_length"], 20);
}

TEST(ObservationWindowScores, PoolingPadsAndReducesInTheConfiguredOrder) {
  ObservationWindowConfig c;
  c.window = 1;
  c.kernel = 3;
  // One head, T = 5 (prefix 4): avgpool divides the zero-padded edges by the kernel, maxpool ignores the padding.
  const std::vector<float> ramp = {1, 2, 3, 4, 100};
  c.pooling = WindowPooling::kAvg;
  EXPECT_EQ(reduce_window_scores(ramp.data(), 5, 1, 1, 5, c).values, (std::vector<float>{1, 2, 3, 7.0f / 3}));
  c.pooling = WindowPooling::kMax;
  EXPECT_EQ(reduce_window_scores(ramp.data(), 5, 1, 1, 5, c).values, (std::vector<float>{2, 3, 4, 4}));
  // Two query heads of one KV head, maxpool and mean: the order matters.
  const std::vector<float> heads = {1, 0, 0, 0, 9, 0, 1, 0, 0, 9};  // [2, 5]
  c.gqa_order = GroupOrder::kReduceThenPool;
  EXPECT_EQ(reduce_window_scores(heads.data(), 5, 2, 1, 5, c).values, (std::vector<float>{0.5f, 0.5f, 0.5f, 0}));
  c.gqa_order = GroupOrder::kPoolThenReduce;
  EXPECT_EQ(reduce_window_scores(heads.data(), 5, 2, 1, 5, c).values, (std::vector<float>{1, 1, 0.5f, 0}));
  // The window's sum becomes its mean; gqa_agg max and sum.
  c.window = 2;
  c.kernel = 1;
  c.gqa_agg = GroupReduce::kMax;
  EXPECT_EQ(reduce_window_scores(heads.data(), 5, 2, 1, 5, c).values, (std::vector<float>{0.5f, 0.5f, 0}));
  c.gqa_agg = GroupReduce::kSum;
  EXPECT_EQ(reduce_window_scores(heads.data(), 5, 2, 1, 5, c).values, (std::vector<float>{0.5f, 0.5f, 0}));
}

// The vectorized interior and the clamped edges of pool_scores give, bit for bit, the per-token fold of the
// definition, for rows shorter than, as long as and longer than the kernel.
TEST(ObservationWindowScores, PoolingMatchesThePerTokenFoldExactly) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int32_t n : {1, 2, 3, 4, 6, 7, 8, 15, 16, 17, 100, 1001}) {
    std::vector<float> in(static_cast<size_t>(n));
    for (float& x : in) x = u(rng) < 0.2f ? 0.0f : u(rng);
    for (int32_t kernel : {1, 3, 5, 7, 9, 31}) {
      for (WindowPooling pooling : {WindowPooling::kAvg, WindowPooling::kMax}) {
        std::vector<float> got(static_cast<size_t>(n));
        pool_scores(in.data(), got.data(), n, kernel, pooling);
        for (int32_t j = 0; j < n; ++j) {
          const int32_t first = std::max(0, j - kernel / 2), last = std::min(n - 1, j + kernel / 2);
          float want = pooling == WindowPooling::kMax ? -std::numeric_limits<float>::infinity() : 0.0f;
          for (int32_t i = first; i <= last; ++i) want = pooling == WindowPooling::kMax ? std::max(want, in[i]) : want + in[i];
          if (pooling == WindowPooling::kAvg) want /= static_cast<float>(kernel);
          ASSERT_EQ(got[static_cast<size_t>(j)], want) << "n " << n << " kernel " << kernel << " j " << j;
        }
      }
    }
  }
}

TEST(TopKAscending, BreaksTiesTowardsTheLowerIndex) {
  const std::vector<float> s = {1, 3, 3, 2, 3};
  EXPECT_EQ(top_k_ascending(s.data(), 5, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(top_k_ascending(s.data(), 5, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(top_k_ascending(s.data(), 5, 4), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(top_k_ascending(s.data(), 5, 0), (std::vector<int32_t>{}));
  EXPECT_EQ(top_k_ascending(s.data(), 5, 9).size(), 5u);
}

TEST(TopKAscending, MatchesSortingByScoreThenIndex) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> few_values(0, 9);  // many ties
  std::vector<int32_t> out;
  for (int32_t n : {1, 17, 300, 4097}) {
    std::vector<float> s(static_cast<size_t>(n));
    for (float& x : s) x = static_cast<float>(few_values(rng));
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
    for (int32_t k : {0, 1, n / 3, n - 1, n}) {
      std::vector<int32_t> expected(order.begin(), order.begin() + std::max(k, 0));
      std::sort(expected.begin(), expected.end());
      top_k_ascending(s.data(), n, k, out);
      EXPECT_EQ(out, expected) << "n " << n << " k " << k;
    }
  }
}

TEST(PyramidKvBudget, FollowsTheKvCacheFactorySchedule) {
  // C 2048, w 64, beta 20, 32 layers, T 10000: min 99, max 3869, step (3869 - 99) / 31 = 121.
  EXPECT_EQ(PyramidKvMethod::layer_prefix_budget(10000, 2048, 64, 20, 32, 0), 3869);
  EXPECT_EQ(PyramidKvMethod::layer_prefix_budget(10000, 2048, 64, 20, 32, 1), 3748);
  EXPECT_EQ(PyramidKvMethod::layer_prefix_budget(10000, 2048, 64, 20, 32, 31), 3869 - 31 * 121);
  // C < T < 2 (C - w): SnapKV's uniform C - w.
  EXPECT_EQ(PyramidKvMethod::layer_prefix_budget(3000, 2048, 64, 20, 32, 0), 1984);
  EXPECT_EQ(PyramidKvMethod::layer_prefix_budget(3000, 2048, 64, 20, 32, 31), 1984);
  // C 40, w 8, T 100, 3 layers: min 1, max 63 (< T - w = 92), step 31.
  for (int l = 0; l < 3; ++l) EXPECT_EQ(PyramidKvMethod::layer_prefix_budget(100, 40, 8, 20, 3, l), 63 - 31 * l);
  // T 70: max 63 >= T - w = 62 -> max 62, min 64 - 62 = 2, step 30.
  for (int l = 0; l < 3; ++l) EXPECT_EQ(PyramidKvMethod::layer_prefix_budget(70, 40, 8, 20, 3, l), 62 - 30 * l);
  // One layer: C - w.
  EXPECT_EQ(PyramidKvMethod::layer_prefix_budget(100, 40, 8, 20, 1, 0), 32);
}

TEST(PyramidKvBudget, FollowsTheKvpressSchedule) {
  auto layers = [](int32_t num_tokens, double budget, int32_t window, int num_layers) {
    std::vector<int32_t> out;
    for (int l = 0; l < num_layers; ++l)
      out.push_back(PyramidKvMethod::kvpress_layer_tokens(num_tokens, budget, window, 20, num_layers, l));
    return out;
  };
  // T 2000, r 0.5 (C 1000), w 64: max 1950 >= T - w -> max 1936, min 2000 - 1936 = 64 >= w: 1936 .. 64.
  EXPECT_EQ(layers(2000, 1000, 64, 4), (std::vector<int32_t>{1936, 1312, 688, 64}));
  // r 0.75 (C 500): min 1000 - 1936 < w -> the uniform fallback round(C).
  EXPECT_EQ(layers(2000, 500, 64, 4), (std::vector<int32_t>{500, 500, 500, 500}));
  // T 777, r 0.5: C = 388.5 gives min 777 - 713 = 64 = w (a pyramid); the integer 388 gives 63 (the fallback).
  EXPECT_EQ(layers(777, 388.5, 64, 4), (std::vector<int32_t>{713, 497, 280, 64}));
  EXPECT_EQ(layers(777, 388, 64, 4), (std::vector<int32_t>{388, 388, 388, 388}));
  EXPECT_EQ(layers(777, 388.5, 8, 4), (std::vector<int32_t>{758, 512, 265, 19}));
  // round() is half to even: 18, 14.5, 11, 7.5, 4.
  EXPECT_EQ(layers(20, 11, 2, 5), (std::vector<int32_t>{18, 14, 11, 8, 4}));
  // One layer keeps round(max).
  EXPECT_EQ(layers(2000, 1000, 64, 1), (std::vector<int32_t>{1936}));
}

TEST(AdaKvBudget, KvpressForcesEachHeadsTopThenTakesTheGlobalTop) {
  WindowScores s;
  s.num_kv_heads = 2;
  s.num_prefix = 6;
  s.num_tokens = 8;  // window 2
  s.values = {0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.45f, 0.01f, 0.02f, 0.03f, 0.04f, 0.05f};
  using Kept = std::vector<std::vector<int32_t>>;
  // C 5: 6 prefix slots. alpha 0: the global top 6 (head 0's 0.9 .. 0.5, head 1's 0.45).
  EXPECT_EQ(AdaKvMethod::kvpress_prefix_kept(s, 5, 2, 0.0), (Kept{{0, 1, 2, 3, 4}, {0}}));
  // alpha 0.2: n_safe = int(1.0) = 1, all of it taken by the window: the same as alpha 0.
  EXPECT_EQ(AdaKvMethod::kvpress_prefix_kept(s, 5, 2, 0.2), (Kept{{0, 1, 2, 3, 4}, {0}}));
  // alpha 0.8: n_safe 4 -> 2 prefix tokens forced per head, then the global top 2 of the rest.
  EXPECT_EQ(AdaKvMethod::kvpress_prefix_kept(s, 5, 2, 0.8), (Kept{{0, 1, 2, 3}, {0, 5}}));
  // alpha 1: n_safe = C -> every head its own top C - w (SnapKV).
  EXPECT_EQ(AdaKvMethod::kvpress_prefix_kept(s, 5, 2, 1.0), (Kept{{0, 1, 2}, {0, 4, 5}}));
  EXPECT_EQ(AdaKvMethod::kvpress_num_forced(388, 64, 0.2), 13);  // int(77.6) - 64
  EXPECT_EQ(AdaKvMethod::kvpress_num_forced(10, 1, 0.05), 0);    // max(1, int(0.5)) - 1
  EXPECT_EQ(AdaKvMethod::kvpress_num_forced(10, 1, 0.0), 0);
}

TEST(AdaKvBudget, SplitsTheLayerBudgetAcrossHeads) {
  WindowScores s;
  s.num_kv_heads = 2;
  s.num_prefix = 6;
  s.num_tokens = 8;
  // Head 0 concentrates its attention, head 1 spreads it: head 0 holds 7 of the global top 8.
  s.values = {0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.45f, 0.01f, 0.02f, 0.03f, 0.04f, 0.05f};
  // B = 4, alpha 0.25: floor int(1.0) = 1; n = {6, 2} -> round(4.5 + 1) = 6 (half to even), round(1.5 + 1) = 2.
  EXPECT_EQ(AdaKvMethod::head_capacities(s, 4, 0.25), (std::vector<int32_t>{6, 2}));
  // alpha 0: purely the global top; alpha 1: B each.
  EXPECT_EQ(AdaKvMethod::head_capacities(s, 4, 0.0), (std::vector<int32_t>{6, 2}));
  EXPECT_EQ(AdaKvMethod::head_capacities(s, 4, 1.0), (std::vector<int32_t>{4, 4}));
  // B = 2, alpha 0.5: top 4 = head 0's first four; n = {4, 0} -> round(2 + 1) = 3, round(0 + 1) = 1.
  EXPECT_EQ(AdaKvMethod::head_capacities(s, 2, 0.5), (std::vector<int32_t>{3, 1}));
}

TEST(ChunkKvBudget, KeepsWholeChunksAndTheWindowChunks) {
  // T 100, w 10, c 20: 5 chunks, chunk 4 overlaps the window; budget 50 -> 2 chunks = 40 tokens.
  EXPECT_EQ(ChunkKvMethod::num_kept_tokens(100, 50, 10, 20), 40);
  // T 105: 6 chunks, the last partial (5 tokens); the window [95, 105) overlaps chunks 4 and 5.
  EXPECT_EQ(ChunkKvMethod::num_kept_tokens(105, 50, 10, 20), 20 + 5);
  EXPECT_EQ(ChunkKvMethod::num_kept_tokens(105, 70, 10, 20), 2 * 20 + 5);
  // The window chunks alone exceed the budget: they are kept anyway.
  EXPECT_EQ(ChunkKvMethod::num_kept_tokens(100, 25, 24, 20), 40);
}

TEST(ObservationWindowMemory, ResidentPagesAfterCompression) {
  const KvLayout layout{2, 2, 8, 16, DType::kF32};  // 4 streams of 16-token pages
  auto snapkv = create_method("snapkv", {{"budget", 50}, {"window", 8}});
  ASSERT_TRUE(snapkv.is_ok());
  EXPECT_EQ((*snapkv)->resident_pages(layout, 100, 40), 4 * 3);   // mid-prompt: every token
  EXPECT_EQ((*snapkv)->resident_pages(layout, 100, 100), 4 * 4);  // 50 tokens per stream
  EXPECT_EQ((*snapkv)->resident_pages(layout, 100, 115), 4 * 5);  // 50 + 15 decode tokens
  EXPECT_EQ((*snapkv)->resident_pages(layout, 50, 60), 4 * 4);    // T <= budget: not compressed
  EXPECT_EQ((*snapkv)->peak_pages(layout, 100, 15), 4 * 7);       // the uncompressed prompt
  auto pyramid = create_method("pyramidkv", {{"budget", 40}, {"window", 8}, {"schedule", "kvcache_factory"}});
  ASSERT_TRUE(pyramid.is_ok());  // T 100, 2 layers: min 1, max 63, step 62 -> 71 and 9 tokens
  EXPECT_EQ((*pyramid)->resident_pages(layout, 100, 100), 2 * 5 + 2 * 1);
  // kvpress, T 100, 2 layers: C 40, w 1: min 2, max 78 -> 78 and 2 tokens (+ 10 decode: 88 and 12).
  auto kvpress_pyramid = create_method("pyramidkv", {{"budget", 40}, {"window", 1}});
  ASSERT_TRUE(kvpress_pyramid.is_ok());
  EXPECT_EQ((*kvpress_pyramid)->resident_pages(layout, 100, 100), 2 * 5 + 2 * 1);
  EXPECT_EQ((*kvpress_pyramid)->resident_pages(layout, 100, 110), 2 * 6 + 2 * 1);
  // w 8: min 2 < w -> the fallback, 40 tokens per stream.
  auto kvpress_uniform = create_method("pyramidkv", {{"budget", 40}, {"window", 8}});
  ASSERT_TRUE(kvpress_uniform.is_ok());
  EXPECT_EQ((*kvpress_uniform)->resident_pages(layout, 100, 100), 4 * 3);
  auto chunk = create_method("chunkkv", {{"budget", 50}, {"window", 10}});
  ASSERT_TRUE(chunk.is_ok());
  EXPECT_EQ((*chunk)->resident_pages(layout, 100, 101), 4 * 3);  // 40 + 1 tokens
  // AdaKV: an upper bound over every split. B 42, alpha 0.2: int(B a) = 8; the caps sum to at most
  // 2 * (33.6 + 8 + 0.5) -> 84 tokens, each head 8..92, so a layer's two streams hold at most 84 + 2 * 8 = 100
  // tokens, each >= 16: at most 8 pages (e.g. 17 + 83 tokens -> 2 + 6 pages).
  auto ada = create_method("adakv", {{"budget", 50}, {"window", 8}, {"variant", "adakv_reference"}});
  ASSERT_TRUE(ada.is_ok());
  EXPECT_EQ((*ada)->resident_pages(layout, 100, 100), 2 * 8);
  EXPECT_EQ((*ada)->resident_pages(layout, 100, 40), 4 * 3);
  // kvpress: a layer's two streams hold exactly 2C prompt tokens. C 50, alpha 0.2: n_safe 10 -> 2 forced, so each
  // holds 10..90 of 100: at most 8 pages (17 + 83).
  auto ada_kvpress = create_method("adakv", {{"budget", 50}, {"window", 8}});
  ASSERT_TRUE(ada_kvpress.is_ok());
  EXPECT_EQ((*ada_kvpress)->resident_pages(layout, 100, 100), 2 * 8);
  // C 41, alpha 0: each holds 8..74 of 82, at most 7 pages (17 + 65); alpha 1: every head exactly 41, 3 pages.
  auto ada_free = create_method("adakv", {{"budget", 41}, {"window", 8}, {"floor_alpha", 0.0}});
  ASSERT_TRUE(ada_free.is_ok());
  EXPECT_EQ((*ada_free)->resident_pages(layout, 100, 100), 2 * 7);
  auto ada_uniform = create_method("adakv", {{"budget", 41}, {"window", 8}, {"floor_alpha", 1.0}});
  ASSERT_TRUE(ada_uniform.is_ok());
  EXPECT_EQ((*ada_uniform)->resident_pages(layout, 100, 100), 2 * 6);
}

}  // namespace
}  // namespace se
