// The SnapKV family over a KIVI store, through the tiny model's forward: the store holds the prompt at full
// precision until it is computed, so every method scores the same keys as over an explicit fp32 cache and keeps the
// same tokens per stream (per-head and per-layer budgets included); the sequence then decodes as KIVI over the kept
// tokens, the layout bounds every step's pages, and the pool is whole after the sequences finish or are taken out.
// StreamingLLM over KIVI drops whole quantized groups as decode runs: every stream keeps its sinks' group and the
// method's recent tokens, and attention reads exactly the kept tokens as the store quantized them. H2O over KIVI drops
// the whole quantized groups of least accumulated attention.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "../support/tiny_model.h"
#include "backend/cpu/kivi_rows.h"
#include "sparse/kivi_cache_manager.h"
#include "sparse/method_registry.h"
#include "sparse/sparse_controller.h"

namespace se {
namespace {

constexpr int32_t kPrompt = 90, kChunk = 32, kDecode = 40;
// The decode-time eviction tests: KIVI's groups and residual window, and the tokens a sequence runs to.
constexpr int32_t kGroup = 32, kLong = 200;

std::vector<int32_t> test_tokens(int32_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = (i * 37 + 11) % 96;
  return tokens;
}

// The method's store over `layout` (its create_cache, as the engine builds it).
std::unique_ptr<CacheManager> cache_for(MethodRuntime& method, const KvLayout& layout) {
  auto cache = method.create_cache(CacheSpec{layout, 2048, cpu_allocator(), false});
  SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
  return std::move(cache).value();
}

// One step of sequence 0 (whose prompt has `num_prompt` tokens) over tokens[begin, begin + n), reserved: the model's
// forward through `controller` and its finish_step; the caller reports it computed.
void forward_step(Model& model, SparseController& controller, const std::vector<int32_t>& tokens, int32_t begin,
                  int32_t n, int32_t num_prompt) {
  ForwardBatch batch;
  batch.sequences.push_back({0, 0, n, num_prompt});
  for (int32_t i = 0; i < n; ++i) {
    batch.token_ids.push_back(tokens[static_cast<size_t>(begin) + static_cast<size_t>(i)]);
    batch.positions.push_back(begin + i);
  }
  batch.logit_rows.push_back(n - 1);
  controller.prepare_step(batch);
  ForwardWorkspace workspace = model.make_workspace();
  model.forward(batch, controller, workspace);
  controller.finish_step(batch);
}

// Calls body(model, store, layout) for the tiny model, Llama's and Gemma 3's (whose sliding-window layers keep a
// tail), over each KIVI store, its groups and residual window kGroup tokens.
template <typename Body>
void for_each_model_and_kivi_store(Body&& body) {
  for (const char* type : {"llama", "gemma3_text"}) {
    Model model = test::tiny_model(type);
    const ModelConfig& mc = model.config();
    for (KvStoreKind store : {KvStoreKind::kKivi2, KvStoreKind::kKivi4}) {
      SCOPED_TRACE(std::string(type) + " over " + std::string(kv_store_kind_name(store)));
      body(model, store,
           make_kv_layout(mc.num_layers, mc.num_kv_heads, mc.head_dim, 4, Device::kCpu, store, kGroup, kGroup, kChunk));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// A controller and the store it runs over.
struct ControlledCache {
  SparseController& controller;
  CacheManager& cache;
};

// Runs sequence 0 of each run over `tokens`, its first kPrompt the prompt (in chunks of kChunk), then one token a
// step: each step reserved, within the method's peak, forwarded, checked by `check(tokens computed)`, then taken as
// computed, the store whole.
template <typename Check>
void run_sequence(Model& model, std::initializer_list<ControlledCache> runs, const std::vector<int32_t>& tokens,
                  Check&& check) {
  const auto num_tokens = static_cast<int32_t>(tokens.size());
  for (int32_t begin = 0; begin < num_tokens;) {
    const int32_t n = begin < kPrompt ? std::min(kChunk, kPrompt - begin) : 1;
    for (const ControlledCache& run : runs) {
      ASSERT_TRUE(run.cache.reserve(0, n).is_ok());
      EXPECT_LE(run.cache.num_held_pages(0), run.controller.peak_pages(kPrompt, num_tokens - kPrompt)) << begin;
    }
    for (const ControlledCache& run : runs) forward_step(model, run.controller, tokens, begin, n, kPrompt);
    begin += n;
    check(begin);
    if (::testing::Test::HasFatalFailure()) return;
    for (const ControlledCache& run : runs) {
      run.cache.on_computed(0, tokens, begin);
      ASSERT_TRUE(run.cache.check_integrity().is_ok()) << run.cache.check_integrity().to_string();
    }
  }
}

// Closes sequence 0: every page of the store comes back.
void close_expecting_every_page_back(const ControlledCache& run) {
  run.controller.close(0);
  EXPECT_EQ(run.cache.num_free_pages(), run.cache.num_total_pages());
  EXPECT_TRUE(run.cache.check_integrity().is_ok());
}

// One run of sequence 0 over `prompt` (in chunks of kChunk) and kDecode decode tokens.
class PromptRun {
 public:
  PromptRun(Model& model, MethodRuntime& method, CacheManager& cache)
      : model_(model), cache_(cache), controller_(method, cache) {}

  // Prefills the prompt; returns each stream's kept positions once the prompt is in.
  std::vector<std::vector<int32_t>> prefill(const std::vector<int32_t>& prompt) {
    EXPECT_TRUE(controller_.open(0, prompt).is_ok());
    for (int32_t begin = 0; begin < kPrompt; begin += kChunk) step(prompt, begin, std::min(kChunk, kPrompt - begin));
    std::vector<std::vector<int32_t>> kept;
    const KvLayout& l = cache_.layout();
    for (int layer = 0; layer < l.num_layers; ++layer)
      for (int h = 0; h < l.num_kv_heads; ++h) {
        const std::span<const int32_t> positions = cache_.slot_positions(0, layer, h);
        kept.emplace_back(positions.begin(), positions.end());
      }
    return kept;
  }
  void decode() {
    std::vector<int32_t> tokens(kPrompt + kDecode, 7);
    for (int32_t t = kPrompt; t < kPrompt + kDecode; ++t) step(tokens, t, 1);
  }
  SparseController& controller() { return controller_; }

 private:
  void step(const std::vector<int32_t>& tokens, int32_t begin, int32_t n) {
    const int64_t free_before = cache_.num_free_pages();
    const int64_t expected = cache_.pages_to_reserve(0, n);
    ASSERT_TRUE(cache_.reserve(0, n).is_ok());
    EXPECT_EQ(free_before - cache_.num_free_pages(), expected);
    // The MemoryOracle's peak for the request bounds what it holds at every step.
    EXPECT_LE(cache_.num_held_pages(0), controller_.peak_pages(kPrompt, kDecode)) << "at " << begin;
    forward_step(model_, controller_, tokens, begin, n, kPrompt);
    cache_.on_computed(0, tokens, begin + n);
    const Status integrity = cache_.check_integrity();
    ASSERT_TRUE(integrity.is_ok()) << integrity.to_string();
  }

  Model& model_;
  CacheManager& cache_;
  SparseController controller_;
};

struct Case {
  std::string method;
  nlohmann::json config;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.method << " " << c.config.dump(); }

class KiviEvictionTest : public ::testing::TestWithParam<Case> {};

TEST_P(KiviEvictionTest, KeepsTheTokensOfAnExplicitCacheThenDecodesAsKivi) {
  const Case& c = GetParam();
  Model model = test::tiny_model();
  const ModelConfig& mc = model.config();
  const std::vector<int32_t> prompt = test_tokens(kPrompt);
  for (KvStoreKind store : {KvStoreKind::kKivi2, KvStoreKind::kKivi4}) {
    auto explicit_method = create_method(c.method, c.config);
    auto kivi_method = create_method(c.method, c.config);
    ASSERT_TRUE(explicit_method.is_ok() && kivi_method.is_ok()) << c.method;
    ASSERT_TRUE(check_kv_store_supports(store, Device::kCpu, (*kivi_method)->traits(), c.method).is_ok());
    const KvLayout explicit_layout{mc.num_layers, mc.num_kv_heads, mc.head_dim, 4, DType::kF32};
    const KvLayout kivi_layout =
        make_kv_layout(mc.num_layers, mc.num_kv_heads, mc.head_dim, 4, Device::kCpu, store, 32, 32, kChunk);
    std::unique_ptr<CacheManager> explicit_cache = cache_for(**explicit_method, explicit_layout);
    std::unique_ptr<CacheManager> kivi_cache = cache_for(**kivi_method, kivi_layout);
    ASSERT_NE(dynamic_cast<KiviCacheManager*>(kivi_cache.get()), nullptr);
    PromptRun fp32(model, **explicit_method, *explicit_cache), kivi(model, **kivi_method, *kivi_cache);
    const std::vector<std::vector<int32_t>> want = fp32.prefill(prompt);
    const std::vector<std::vector<int32_t>> got = kivi.prefill(prompt);
    EXPECT_EQ(got, want) << c.method << " over " << kv_store_kind_name(store);
    // The method compressed: fewer tokens than the prompt in every stream.
    for (const std::vector<int32_t>& stream : want) EXPECT_LT(static_cast<int32_t>(stream.size()), kPrompt);
    // Its kept tokens are quantized now, as a prompt of just those tokens would be.
    const AttentionView view = kivi_cache->build_sequence_view(0, 0);
    for (int32_t h = 0; h < view.num_kv_heads; ++h) {
      const int32_t len = view.seqs[0].num_tokens[h];
      EXPECT_EQ(len, static_cast<int32_t>(want[static_cast<size_t>(h)].size()));
      EXPECT_EQ(view.quantized.kivi_seqs[0].num_quantized_keys[h], len / 32 * 32);
      EXPECT_EQ(view.quantized.kivi_seqs[0].num_quantized_values[h], std::max(0, len - 32));
    }
    fp32.decode();
    kivi.decode();
    for (int layer = 0; layer < mc.num_layers; ++layer)
      for (int h = 0; h < mc.num_kv_heads; ++h)
        EXPECT_EQ(kivi_cache->stream_length(0, layer, h), explicit_cache->stream_length(0, layer, h));
    // Taken out and dropped (a preemption's snapshot) or closed (finished, aborted): every page comes back.
    kivi_cache->snapshot(0).reset();
    (*kivi_method)->on_sequence_end(0);
    fp32.controller().close(0);
    EXPECT_EQ(kivi_cache->num_free_pages(), kivi_cache->num_total_pages());
    EXPECT_TRUE(kivi_cache->check_integrity().is_ok());
  }
}

INSTANTIATE_TEST_SUITE_P(SnapKvFamily, KiviEvictionTest,
                         ::testing::Values(Case{"snapkv", {{"budget", 40}, {"window", 8}}},
                                           Case{"pyramidkv",
                                                {{"budget", 40}, {"window", 8}, {"schedule", "kvcache_factory"}}},
                                           Case{"adakv", {{"budget", 40}, {"window", 8}}},
                                           Case{"chunkkv", {{"budget", 40}, {"window", 8}, {"chunk_length", 6}}}),
                         [](const auto& info) { return info.param.method; });

// StreamingLLM (budget 40, 4 sinks) over KIVI (G = R = 32) through the tiny model's forward, Llama's and Gemma 3's
// (whose sliding-window layers keep a tail), beside vanilla over KIVI fed the same tokens. After every step each
// stream holds what the rule over groups allows: the whole group of the sinks on a full-attention layer, the last
// budget - sinks positions (min(budget, W - 1) on a sliding-window layer), a gap of whole groups between, and at most
// a group less one past those and the window; pages stay within the method's peak and come back. Layer 0's keys and
// values come from the tokens alone, so its attention must be attention over vanilla's store at exactly the kept
// positions.
TEST(KiviStreamingLlmTest, AttendsOverTheKeptGroupsOnly) {
  constexpr int32_t kBudget = 40, kSinks = 4;
  const std::vector<int32_t> tokens = test_tokens(kLong);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + kPrompt);
  for_each_model_and_kivi_store([&](Model& model, KvStoreKind store, const KvLayout& layout) {
    const ModelConfig& mc = model.config();
    auto vanilla_method = create_method("vanilla", nullptr);
    auto streaming_method = create_method("streamingllm", {{"budget", kBudget}, {"sink_tokens", kSinks}});
    ASSERT_TRUE(vanilla_method.is_ok() && streaming_method.is_ok());
    std::unique_ptr<CacheManager> vanilla_cache = cache_for(**vanilla_method, layout);
    std::unique_ptr<CacheManager> streaming_cache = cache_for(**streaming_method, layout);
    SparseController vanilla(**vanilla_method, *vanilla_cache), streaming(**streaming_method, *streaming_cache);
    const KiviPageLayout pages = kivi_page_layout(kGroup, layout.kivi_value_group_size, mc.head_dim, kivi_bits(store));
    int32_t compared = 0;
    streaming.set_attention_observer([&](const LayerContext& ctx, const AttentionView& attended) {
      if (ctx.layer != 0) return;
      const std::span<const int32_t> positions = streaming_cache->slot_positions(0, 0, 0);
      const auto len = static_cast<int64_t>(positions.size());
      // Vanilla's store, its step written and not flushed either: slot p holds position p.
      const AttentionView all = vanilla_cache->build_sequence_view(0, 0);
      Tensor k = Tensor::empty(DType::kF32, Shape{len, mc.num_kv_heads, mc.head_dim});
      Tensor v = Tensor::empty(DType::kF32, Shape{len, mc.num_kv_heads, mc.head_dim});
      Tensor k_pos = Tensor::empty(DType::kI32, Shape{len});
      Tensor q_pos = Tensor::empty(DType::kI32, Shape{1});
      std::vector<float> local(static_cast<size_t>(mc.head_dim));
      for (int h = 0; h < mc.num_kv_heads; ++h) {
        const std::span<const int32_t> head = streaming_cache->slot_positions(0, 0, h);
        ASSERT_TRUE(std::equal(head.begin(), head.end(), positions.begin(), positions.end()));
        const cpu::KiviRows rows = cpu::KiviRows::of(all, pages, 0, h);
        for (int64_t i = 0; i < len; ++i) {
          const int64_t at = (i * mc.num_kv_heads + h) * mc.head_dim;
          std::copy_n(rows.key(positions[static_cast<size_t>(i)], local.data()), mc.head_dim, k.data<float>() + at);
          std::copy_n(rows.value(positions[static_cast<size_t>(i)], local.data()), mc.head_dim, v.data<float>() + at);
        }
      }
      for (int64_t i = 0; i < len; ++i) k_pos.data<int32_t>()[i] = positions[static_cast<size_t>(i)];
      q_pos.data<int32_t>()[0] = positions.back();
      // The step's last query row over what attention reads, and over the reference.
      Tensor q = Tensor::empty(DType::kF32, Shape{1, mc.num_heads, mc.head_dim});
      const TensorView last = ctx.last_query_row(0);
      std::copy_n(last.ptr<float>(), q.numel(), q.data<float>());
      AttentionView one_row = attended;
      const int32_t q_indptr[2] = {0, 1};
      one_row.q_indptr = q_indptr;
      Tensor got = Tensor::zeros(DType::kF32, Shape{1, mc.num_heads, mc.head_dim});
      Tensor want = Tensor::zeros(DType::kF32, Shape{1, mc.num_heads, mc.head_dim});
      paged_attention(got.view(), q.view(), one_row, ctx.params);
      attention(want.view(), q.view(), k.view(), v.view(), q_pos.view(), k_pos.view(), ctx.params);
      for (int64_t i = 0; i < got.numel(); ++i)
        ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-4f) << "at " << len << ", " << i;
      ++compared;
    });
    ASSERT_TRUE(vanilla.open(0, prompt).is_ok());
    ASSERT_TRUE(streaming.open(0, prompt).is_ok());
    int64_t dropped = 0;
    const ControlledCache vanilla_run{vanilla, *vanilla_cache}, streaming_run{streaming, *streaming_cache};
    run_sequence(model, {vanilla_run, streaming_run}, tokens, [&](int32_t begin) {
      for (int layer = 0; layer < mc.num_layers; ++layer) {
        const bool sliding = mc.layers[static_cast<size_t>(layer)].sliding;
        const int32_t recent = sliding ? std::min(kBudget, mc.sliding_window - 1) : kBudget - kSinks;
        const int32_t sinks = sliding ? 0 : std::min(begin, kGroup);
        for (int h = 0; h < mc.num_kv_heads; ++h) {
          const std::span<const int32_t> positions = streaming_cache->slot_positions(0, layer, h);
          const auto len = static_cast<int32_t>(positions.size());
          ASSERT_GE(len, std::min(begin, sinks + recent));
          for (int32_t i = 0; i < sinks; ++i) ASSERT_EQ(positions[static_cast<size_t>(i)], i) << layer;
          for (int32_t i = 0; i < std::min(begin, recent); ++i)
            ASSERT_EQ(positions[static_cast<size_t>(len - 1 - i)], begin - 1 - i) << layer;
          // What else it holds: whole groups, from the sinks' group on, then at most a group less one past the
          // recent tokens and the window.
          if (len == sinks) continue;
          const int32_t gap = positions[static_cast<size_t>(sinks)] - sinks;
          ASSERT_EQ(gap % kGroup, 0) << layer;
          for (int32_t i = sinks; i < len; ++i) ASSERT_EQ(positions[static_cast<size_t>(i)], i + gap) << layer;
          ASSERT_LT(len, sinks + std::max(recent, kGroup) + kGroup) << layer;
          if (layer == 0 && h == 0) dropped = std::max<int64_t>(dropped, gap);
        }
      }
    });
    EXPECT_GT(dropped, 0);
    EXPECT_EQ(compared, (kPrompt + kChunk - 1) / kChunk + (kLong - kPrompt));
    vanilla.close(0);
    close_expecting_every_page_back(streaming_run);
  });
}

// H2O (budget 100: heavy 50, recent 50) over KIVI (G = R = 32) through the tiny model's forward, Llama's and Gemma 3's
// (whose sliding-window layers keep a tail). After every step each full-attention stream dropped, from the stream
// the step left (what it kept and what it dropped, with their accumulated scores), whole sealed groups older than its
// recent tokens, as many as bring it under budget + G or all there are, and no kept such group sums less than a
// dropped one; the recent tokens are all there, slots stay in position order, pages stay within the method's peak,
// the store stays whole and every page comes back.
TEST(KiviH2oTest, DropsTheSealedGroupsOfLeastAccumulatedAttention) {
  constexpr int32_t kBudget = 100, kRecent = 50;
  const std::vector<int32_t> tokens = test_tokens(kLong);
  const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + kPrompt);
  for_each_model_and_kivi_store([&](Model& model, KvStoreKind store, const KvLayout& layout) {
    const ModelConfig& mc = model.config();
    auto method = create_method("h2o", {{"budget", kBudget}});
    ASSERT_TRUE(method.is_ok());
    ASSERT_TRUE(check_kv_store_supports(store, Device::kCpu, (*method)->traits(), "h2o").is_ok());
    std::unique_ptr<CacheManager> cache = cache_for(**method, layout);
    SparseController h2o(**method, *cache);
    ASSERT_TRUE(h2o.open(0, prompt).is_ok());
    int64_t dropped_groups = 0, dropped_past_the_oldest = 0;
    const ControlledCache run{h2o, *cache};
    run_sequence(model, {run}, tokens, [&](int32_t begin) {
      const nlohmann::json state = (*method)->debug_state(0);
      for (int layer = 0; layer < mc.num_layers; ++layer) {
        const bool sliding = mc.layers[static_cast<size_t>(layer)].sliding;
        const int32_t recent = sliding ? std::min(kBudget, mc.sliding_window - 1) : kRecent;
        for (int h = 0; h < mc.num_kv_heads; ++h) {
          const std::span<const int32_t> positions = cache->slot_positions(0, layer, h);
          const auto len = static_cast<int32_t>(positions.size());
          ASSERT_TRUE(std::is_sorted(positions.begin(), positions.end()));
          for (int32_t i = 0; i < std::min(begin, recent); ++i)
            ASSERT_EQ(positions[static_cast<size_t>(len - 1 - i)], begin - 1 - i) << layer;
          ASSERT_LT(len, std::max(kBudget, kGroup) + kGroup) << layer;
          if (sliding) continue;
          // The stream before the step's eviction: its kept and dropped tokens by position, with their scores.
          std::vector<std::pair<int32_t, float>> before;
          const nlohmann::json& acc = state["acc"][layer][h];
          before.reserve(positions.size() + state["dropped"][layer][h].size());
          ASSERT_EQ(acc.size(), positions.size());
          for (int32_t j = 0; j < len; ++j)
            before.emplace_back(positions[static_cast<size_t>(j)], acc[static_cast<size_t>(j)].get<float>());
          std::vector<bool> dropped(before.size(), false);
          for (const auto& token : state["dropped"][layer][h]) {
            before.emplace_back(token[0].get<int32_t>(), token[1].get<float>());
            dropped.push_back(true);
          }
          std::vector<size_t> order(before.size());
          std::iota(order.begin(), order.end(), size_t{0});
          std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return before[a].first < before[b].first; });
          const auto num_dropped = static_cast<int32_t>(before.size()) - len;
          ASSERT_EQ(num_dropped % kGroup, 0) << layer;
          const int32_t sealed = cache->sealed_groups(0, layer, h).count + num_dropped / kGroup;
          const auto was = static_cast<int32_t>(before.size());
          const int32_t candidates = std::min(sealed, std::max(0, was - recent) / kGroup);
          const int32_t want_dropped = was < kBudget + kGroup ? 0 : std::min(candidates, (was - kBudget) / kGroup);
          ASSERT_EQ(num_dropped, want_dropped * kGroup) << "layer " << layer << " at " << begin;
          // Whole candidate groups went, and none kept sums less than one dropped.
          float most_dropped = -1.0f, least_kept = std::numeric_limits<float>::infinity();
          for (int32_t g = 0; g < candidates; ++g) {
            float sum = 0.0f;
            const bool gone = dropped[order[static_cast<size_t>(g) * kGroup]];
            for (int32_t j = g * kGroup; j < (g + 1) * kGroup; ++j) {
              ASSERT_EQ(dropped[order[static_cast<size_t>(j)]], gone) << "a group split at " << begin;
              sum += before[order[static_cast<size_t>(j)]].second;
            }
            if (gone) {
              most_dropped = std::max(most_dropped, sum);
              dropped_past_the_oldest += g >= want_dropped;
            } else {
              least_kept = std::min(least_kept, sum);
            }
          }
          for (int32_t j = candidates * kGroup; j < was; ++j) ASSERT_FALSE(dropped[order[static_cast<size_t>(j)]]);
          EXPECT_LE(most_dropped, least_kept) << "layer " << layer << " at " << begin;
          dropped_groups += want_dropped;
        }
      }
    });
    // Groups went, some of them by their scores rather than their age.
    EXPECT_GT(dropped_groups, 0);
    EXPECT_GT(dropped_past_the_oldest, 0);
    close_expecting_every_page_back(run);
  });
}

}  // namespace
}  // namespace se
