// The SnapKV family over a KIVI store, through the tiny model's forward: the store holds the prompt at full
// precision until it is computed, so every method scores the same keys as over an explicit fp32 cache and keeps the
// same tokens per stream (per-head and per-layer budgets included); the sequence then decodes as KIVI over the kept
// tokens, the layout bounds every step's pages, and the pool is whole after the sequences finish or are taken out.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "../support/tiny_model.h"
#include "sparse/kivi_cache_manager.h"
#include "sparse/method_registry.h"
#include "sparse/sparse_controller.h"

namespace se {
namespace {

constexpr int32_t kPrompt = 90, kChunk = 32, kDecode = 40;

// The method's store over `layout` (its create_cache, as the engine builds it).
std::unique_ptr<CacheManager> cache_for(MethodRuntime& method, const KvLayout& layout) {
  auto cache = method.create_cache(CacheSpec{layout, 2048, cpu_allocator(), false});
  SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
  return std::move(cache).value();
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
    ForwardBatch batch;
    batch.sequences.push_back({0, 0, n, kPrompt});
    for (int32_t i = 0; i < n; ++i) {
      batch.token_ids.push_back(tokens[static_cast<size_t>(begin) + static_cast<size_t>(i)]);
      batch.positions.push_back(begin + i);
    }
    batch.logit_rows.push_back(n - 1);
    controller_.prepare_step(batch);
    ForwardWorkspace workspace = model_.make_workspace();
    model_.forward(batch, controller_, workspace);
    controller_.finish_step(batch);
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
  std::vector<int32_t> prompt(kPrompt);
  for (int32_t i = 0; i < kPrompt; ++i) prompt[static_cast<size_t>(i)] = (i * 37 + 11) % 96;
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

}  // namespace
}  // namespace se
