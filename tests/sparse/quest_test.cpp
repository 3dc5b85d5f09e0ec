// Quest sizes its page lists and its ranking's stride in prepare_step, before the engine decides whether a captured
// decode step still fits its buffers (a replayed step runs none of the layer hooks): the stride follows the decode
// sequences' growth, and each change bumps device_buffers_generation.
#include <gtest/gtest.h>

#include "backend/step_graph.h"
#include "sparse/method_registry.h"
#include "sparse/method_runtime.h"

namespace se {
namespace {

TEST(QuestTest, PrepareStepGrowsTheRankingBeforeTheForward) {
  auto method = create_method("quest", {{"token_budget", 32}});
  ASSERT_TRUE(method.is_ok()) << method.status().to_string();
  MethodRuntime& quest = **method;
  CacheSpec spec;
  spec.layout.num_layers = 1;
  spec.layout.num_kv_heads = 1;
  spec.layout.head_dim = 4;
  spec.layout.page_size = 16;
  spec.layout.dtype = DType::kF32;
  spec.num_pages = 1024;
  spec.allocator = cpu_allocator();
  auto cache = quest.create_cache(spec);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  ASSERT_TRUE((*cache)->open(0, {}).is_ok());

  // One decode token of sequence 0 once the cache holds `num_tokens` tokens.
  const auto decode_step = [&](int32_t num_tokens) {
    const int32_t more = num_tokens - (*cache)->num_logical_tokens(0);
    SE_CHECK((*cache)->reserve(0, more).is_ok(), "reserve {}", more);
    ForwardBatch batch;
    batch.token_ids = {0};
    batch.positions = {num_tokens - 1};
    batch.sequences = {{0, 0, 1, 100}};
    StepContext ctx{batch, **cache, {}, {}};
    quest.prepare_step(ctx);
    return StepGraph::buffers_generation();
  };
  const uint64_t first = decode_step(2000);  // 125 pages
  EXPECT_EQ(decode_step(2016), first) << "one page more fits the room laid out";
  EXPECT_EQ(decode_step(2400), first);
  EXPECT_GT(decode_step(4800), first) << "300 pages outgrow it before the forward runs";
}

}  // namespace
}  // namespace se
