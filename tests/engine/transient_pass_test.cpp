// The transient-pass contract methods like kvzip build on: SparseController::run_transient_pass runs extra
// tokens on top of a sequence's cache and leaves no trace (pages, lengths, later logits), refuses nesting and
// drivers without a model forward, and runs on every tensor-parallel rank or on none; CacheManager::truncate drops the
// newest tokens of compacted streams too; and the MemoryOracle keeps the passes' room free in the step that completes a
// prompt.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "../support/tiny_model.h"
#include "engine/memory_oracle.h"
#include "parallel/local_comm_group.h"
#include "sparse/method_registry.h"
#include "sparse/paged_cache_manager.h"

namespace se {
namespace {

KvLayout tiny_layout(const ModelConfig& c, int page_size) {
  return KvLayout{c.num_layers, c.num_kv_heads, c.head_dim, page_size, DType::kF32};
}

std::vector<int32_t> random_ids(std::mt19937& rng, int n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& t : ids) t = static_cast<int32_t>(rng() % 96);
  return ids;
}

// One sequence on the tiny model under `vanilla`: prefill `prompt`, optionally a transient pass, then one
// decode token; returns the decode logits.
std::vector<float> decode_after(const std::vector<int32_t>& prompt, const std::vector<int32_t>& pass,
                                int32_t decode_token) {
  Model model = test::tiny_model();
  auto cache = PagedCacheManager::create(tiny_layout(model.config(), 4), 512, cpu_allocator(), false);
  SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
  auto method = create_method("vanilla", nullptr);
  SE_CHECK(method.is_ok(), "vanilla");
  SparseController controller(**method, **cache);
  ForwardWorkspace workspace = model.make_workspace();
  controller.set_pass_forward([&](const ForwardBatch& b) { (void)model.forward(b, controller, workspace); });
  SE_CHECK(controller.open(0, {}).is_ok(), "open");
  auto step = [&](const std::vector<int32_t>& ids, int32_t first_position) {
    SE_CHECK((*cache)->reserve(0, static_cast<int32_t>(ids.size())).is_ok(), "reserve");
    ForwardBatch batch;
    batch.token_ids = ids;
    for (size_t i = 0; i < ids.size(); ++i) batch.positions.push_back(first_position + static_cast<int32_t>(i));
    batch.sequences = {{0, 0, static_cast<int32_t>(ids.size()), static_cast<int32_t>(prompt.size())}};
    batch.logit_rows = {static_cast<int32_t>(ids.size()) - 1};
    controller.prepare_step(batch);
    Tensor logits = model.forward(batch, controller, workspace);
    controller.finish_step(batch);
    return std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel());
  };
  step(prompt, 0);
  const int64_t held = (*cache)->num_held_pages(0), free_pages = (*cache)->num_free_pages();
  if (!pass.empty()) {
    EXPECT_TRUE(controller.run_transient_pass(0, pass).is_ok());
    EXPECT_EQ((*cache)->num_held_pages(0), held);
    EXPECT_EQ((*cache)->num_free_pages(), free_pages);
    EXPECT_EQ((*cache)->num_logical_tokens(0), static_cast<int32_t>(prompt.size()));
    EXPECT_EQ(controller.num_transient_pass_tokens(), static_cast<int64_t>(pass.size()));
    EXPECT_TRUE((*cache)->check_integrity().is_ok());
  }
  std::vector<float> logits = step({decode_token}, static_cast<int32_t>(prompt.size()));
  controller.close(0);
  EXPECT_EQ((*cache)->num_free_pages(), (*cache)->num_total_pages());
  return logits;
}

TEST(TransientPassTest, LeavesNoTraceInPagesLengthsOrLaterLogits) {
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt = random_ids(rng, 21), pass = random_ids(rng, 13);
  const std::vector<float> with_pass = decode_after(prompt, pass, 5);
  const std::vector<float> without = decode_after(prompt, {}, 5);
  ASSERT_EQ(with_pass.size(), without.size());
  for (size_t i = 0; i < with_pass.size(); ++i) EXPECT_FLOAT_EQ(with_pass[i], without[i]) << i;
}

// Records what finish_step offers and tries to nest a pass from inside one.
class ProbeMethod final : public MethodRuntime {
 public:
  ProbeMethod() : MethodRuntime("probe", {}) {}
  void on_attention_end(LayerContext& /*ctx*/) override {
    if (in_pass && controller != nullptr) nested = controller->run_transient_pass(0, std::vector<int32_t>{1});
  }
  void finish_step(StepContext& ctx) override {
    offered = static_cast<bool>(ctx.run_transient_pass);
    if (!offered) return;
    in_pass = true;
    outcome = ctx.run_transient_pass(0, std::vector<int32_t>{1, 2, 3});
    in_pass = false;
  }
  SparseController* controller = nullptr;
  bool offered = false, in_pass = false;
  Status outcome, nested;
};

TEST(TransientPassTest, OfferedOnlyWithAModelForwardAndNeverNested) {
  Model model = test::tiny_model();
  auto cache = PagedCacheManager::create(tiny_layout(model.config(), 4), 256, cpu_allocator(), false);
  ASSERT_TRUE(cache.is_ok());
  ProbeMethod probe;
  SparseController controller(probe, **cache);
  probe.controller = &controller;
  ASSERT_TRUE(controller.open(0, {}).is_ok());
  ForwardBatch batch;
  batch.token_ids = {4, 5};
  batch.positions = {0, 1};
  batch.sequences = {{0, 0, 2, 2}};
  ASSERT_TRUE((*cache)->reserve(0, 2).is_ok());
  ForwardWorkspace workspace = model.make_workspace();
  (void)model.forward(batch, controller, workspace);
  controller.finish_step(batch);
  EXPECT_FALSE(probe.offered);
  EXPECT_EQ(controller.run_transient_pass(0, std::vector<int32_t>{1}).code(), StatusCode::kFailedPrecondition);

  controller.set_pass_forward([&](const ForwardBatch& b) { (void)model.forward(b, controller, workspace); });
  controller.finish_step(batch);
  EXPECT_TRUE(probe.offered);
  EXPECT_TRUE(probe.outcome.is_ok()) << probe.outcome.to_string();
  EXPECT_EQ(probe.nested.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*cache)->num_logical_tokens(0), 2);
  EXPECT_EQ(controller.num_transient_pass_tokens(), 3);
  controller.close(0);
  EXPECT_EQ((*cache)->num_free_pages(), (*cache)->num_total_pages());
}

// Two tensor-parallel ranks (threads of one LocalCommGroup), each with its controller over its own pool: a pass
// whose tokens one rank's pool cannot hold runs on neither (a forward on one rank alone would wait in its
// collectives for good), and leaves the rank that could reserve as it was; a pass both can hold runs on both.
TEST(TransientPassTest, RunsOnEveryTensorParallelRankOrOnNone) {
  const ModelConfig config = test::tiny_model().config();
  LocalCommGroup group(2);
  struct Rank {
    std::unique_ptr<CacheManager> cache;
    std::unique_ptr<MethodRuntime> method;
    std::unique_ptr<SparseController> controller;
    int num_forwards = 0;
    Status outcome;
  };
  Rank ranks[2];
  // Four streams of pages of 4 tokens: rank 1's 8 pages hold 8 tokens a stream.
  const int num_pages[2] = {256, 8};
  for (int r = 0; r < 2; ++r) {
    Rank& rank = ranks[r];
    auto cache = PagedCacheManager::create(tiny_layout(config, 4), num_pages[r], cpu_allocator(), false);
    ASSERT_TRUE(cache.is_ok());
    rank.cache = std::move(cache).value();
    auto method = create_method("vanilla", nullptr);
    ASSERT_TRUE(method.is_ok());
    rank.method = std::move(method).value();
    rank.method->set_communicator(group.communicator(r));
    rank.controller = std::make_unique<SparseController>(*rank.method, *rank.cache);
    rank.controller->set_pass_forward([&rank](const ForwardBatch&) { ++rank.num_forwards; });
    ASSERT_TRUE(rank.controller->open(0, {}).is_ok());
  }
  const auto pass_on_both = [&](int num_tokens) {
    const std::vector<int32_t> ids(static_cast<size_t>(num_tokens), 1);
    std::thread other([&] { ranks[1].outcome = ranks[1].controller->run_transient_pass(0, ids); });
    ranks[0].outcome = ranks[0].controller->run_transient_pass(0, ids);
    other.join();
  };
  pass_on_both(13);
  EXPECT_EQ(ranks[1].outcome.code(), StatusCode::kResourceExhausted) << ranks[1].outcome.to_string();
  EXPECT_EQ(ranks[0].outcome.code(), StatusCode::kResourceExhausted) << ranks[0].outcome.to_string();
  EXPECT_NE(ranks[0].outcome.message().find("another tensor-parallel rank"), std::string::npos);
  for (Rank& rank : ranks) {
    EXPECT_EQ(rank.num_forwards, 0);
    EXPECT_EQ(rank.cache->num_logical_tokens(0), 0);
    EXPECT_EQ(rank.cache->num_free_pages(), rank.cache->num_total_pages());
  }
  pass_on_both(7);
  for (Rank& rank : ranks) {
    EXPECT_TRUE(rank.outcome.is_ok()) << rank.outcome.to_string();
    EXPECT_EQ(rank.num_forwards, 1);
    EXPECT_EQ(rank.cache->num_logical_tokens(0), 0);
    rank.controller->close(0);
    EXPECT_EQ(rank.cache->num_free_pages(), rank.cache->num_total_pages());
  }
}

TEST(PagedCacheTruncateTest, DropsTheNewestTokensOfCompactedStreams) {
  const KvLayout layout{2, 2, 8, 4, DType::kF32};
  auto cache = PagedCacheManager::create(layout, 64, cpu_allocator(), false);
  ASSERT_TRUE(cache.is_ok());
  CacheManager& c = **cache;
  ASSERT_TRUE(c.open(0, {}).is_ok());
  ASSERT_TRUE(c.reserve(0, 10).is_ok());
  ASSERT_TRUE(c.evict(0, 1, 0, {1, 3, 5}).is_ok());  // stream (1, 0): 3 tokens, logical length still 10
  const int64_t free_before = c.num_free_pages();
  ASSERT_TRUE(c.reserve(0, 6).is_ok());  // a pass: 6 more everywhere
  EXPECT_EQ(c.stream_length(0, 1, 0), 9);
  ASSERT_TRUE(c.truncate(0, 10).is_ok());
  EXPECT_EQ(c.num_logical_tokens(0), 10);
  EXPECT_EQ(c.stream_length(0, 1, 0), 3);
  EXPECT_EQ(c.stream_length(0, 0, 0), 10);
  EXPECT_EQ(c.num_free_pages(), free_before);
  EXPECT_TRUE(c.check_integrity().is_ok());

  EXPECT_EQ(c.truncate(0, 11).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(c.truncate(0, 6).code(), StatusCode::kFailedPrecondition);  // stream (1, 0) holds only 3
  EXPECT_EQ(c.num_logical_tokens(0), 10);
  EXPECT_EQ(c.stream_length(0, 0, 0), 10);
  c.close(0);
  EXPECT_EQ(c.num_free_pages(), c.num_total_pages());
}

// kvzip with chunk_size 8 and no tokenizer: a prompt of 20 tokens (16 of context) runs passes of at most
// 8 carried + 8 chunk tokens, so completing it needs that room free beyond its own pages.
TEST(MemoryOracleTest, KeepsTheTransientPassRoomFreeWhenAPromptCompletes) {
  const KvLayout layout{2, 2, 8, 4, DType::kF32};
  auto method = create_method("kvzip", {{"chunk_size", 8}});
  ASSERT_TRUE(method.is_ok()) << method.status().to_string();
  ASSERT_EQ((*method)->transient_extra_tokens(20), 16);
  const int64_t prompt_pages = layout.pages_for_tokens(20), peak = layout.pages_for_tokens(36);
  EXPECT_EQ((*method)->peak_pages(layout, 20, 1), peak);
  for (int64_t num_pages : {peak - 1, peak}) {
    auto cache = PagedCacheManager::create(layout, static_cast<int32_t>(num_pages), cpu_allocator(), false);
    ASSERT_TRUE(cache.is_ok());
    SparseController controller(**method, **cache);
    MemoryOracle oracle(controller);
    EXPECT_EQ(oracle.can_ever_fit(20, 1), num_pages >= peak);
    Request request("r", std::vector<int32_t>(20, 1), SamplingParams{});
    ASSERT_TRUE(oracle.admit(request).is_ok());
    oracle.begin_step();
    EXPECT_TRUE(oracle.try_reserve(request, 12));  // not the prompt's end: no room held back
    request.num_computed_tokens = 12;              // the step ran
    oracle.begin_step();
    EXPECT_EQ(oracle.try_reserve(request, 8), num_pages >= peak);
    if (num_pages >= peak) EXPECT_EQ((*cache)->num_free_pages(), peak - prompt_pages);
    oracle.release(request);
  }
}

}  // namespace
}  // namespace se
