// The --kv-cache-dtype stores through the Engine on the tiny model: FP8 greedy generation stays close to the
// explicit fp32 cache, the pool holds as many more pages as its pages are smaller and is whole after, a prefix
// reused from the radix cache over FP8 pages gives the same tokens as computing it, eviction methods run over FP8
// pages, and a method or value the store cannot take is refused when the engine is built.
#include <gtest/gtest.h>

#include <random>

#include "../support/tiny_engine.h"
#include "../support/tiny_model.h"
#include "engine/engine.h"

namespace se {
namespace {

using test::greedy;
using test::tiny_bundle;

std::vector<int32_t> random_prompt(std::mt19937& rng, int len) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 96);
  return p;
}

EngineConfig store_config(const std::string& kv_cache_dtype, const std::string& method = "vanilla",
                          const nlohmann::json& method_config = nullptr) {
  EngineConfig config;
  config.kv_cache_dtype = kv_cache_dtype;
  // KIVI: the window of 32 tokens flushes twice or more over these prompts and their continuations.
  config.kivi_group_size = 32;
  config.kivi_residual = 32;
  config.sparse_method = method;
  config.sparse_config = method_config;
  config.page_size = 4;
  config.max_num_batched_tokens = 32;  // prompts arrive in several chunks
  config.kv_cache_memory = 8 << 20;
  return config;
}

struct Generated {
  std::vector<std::vector<int32_t>> tokens;  // per request
  std::vector<int> num_cached_tokens;        // per request
  EngineStats stats;                         // once drained
};

// Runs the prompts one after another (so a later one may reuse an earlier one's prefix), each to max_tokens.
Generated generate(const ModelBundle& bundle, const EngineConfig& config,
                   const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  auto engine = Engine::create(bundle, config);
  SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
  Generated g;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto stream = (*engine)->submit({"r" + std::to_string(i), prompts[i], greedy(max_tokens)});
    SE_CHECK(stream.is_ok(), "{}", stream.status().to_string());
    std::vector<int32_t> tokens;
    while (true) {
      auto out = (*stream)->next(std::chrono::milliseconds(60000));
      SE_CHECK(out.has_value(), "stream stalled");
      for (const TokenOutput& t : out->tokens) tokens.push_back(t.token_id);
      if (out->finished) {
        g.num_cached_tokens.push_back(out->num_cached_tokens);
        break;
      }
    }
    g.tokens.push_back(std::move(tokens));
  }
  (*engine)->shutdown(/*drain=*/true);
  g.stats = (*engine)->stats();
  return g;
}

// Teacher-forced next-token agreement: for every step i of every request of `reference`, the token `config`'s
// engine picks after the prompt and the reference's first i tokens, against the reference's token i. Greedy
// continuations compound a single flip into a different text; this counts each step's decision on its own.
double next_token_agreement(const ModelBundle& bundle, const EngineConfig& config,
                            const std::vector<std::vector<int32_t>>& prompts, const Generated& reference) {
  std::vector<std::vector<int32_t>> forced;
  std::vector<int32_t> want;
  for (size_t r = 0; r < prompts.size(); ++r)
    for (size_t i = 0; i < reference.tokens[r].size(); ++i) {
      std::vector<int32_t> prompt = prompts[r];
      prompt.insert(prompt.end(), reference.tokens[r].begin(), reference.tokens[r].begin() + static_cast<int64_t>(i));
      forced.push_back(std::move(prompt));
      want.push_back(reference.tokens[r][i]);
    }
  const Generated got = generate(bundle, config, forced, 1);
  size_t agree = 0;
  for (size_t k = 0; k < want.size(); ++k) agree += got.tokens[k][0] == want[k] ? 1 : 0;
  return static_cast<double>(agree) / static_cast<double>(want.size());
}

TEST(KvStoreEngineTest, Fp8GreedyGenerationStaysCloseToTheExplicitCache) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts(4);
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i] = random_prompt(rng, 40 + 7 * static_cast<int>(i));
  const Generated f32 = generate(bundle, store_config("auto"), prompts, 24);
  const Generated fp8 = generate(bundle, store_config("fp8"), prompts, 24);
  for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(fp8.tokens[r][0], f32.tokens[r][0]) << r;
  const double agreement = next_token_agreement(bundle, store_config("fp8"), prompts, f32);
  RecordProperty("fp8_next_token_agreement", std::to_string(agreement));
  // 87 of 96 on this model (its weights are scaled up, so attention is sharp and a key's rounding can flip a step).
  EXPECT_GE(agreement, 0.85) << "FP8 picks another next token than fp32 too often";
  // The same bytes hold four times the pages (one byte per element against four), and every page came back.
  EXPECT_EQ(fp8.stats.num_kv_pages_total, 4 * f32.stats.num_kv_pages_total);
  EXPECT_EQ(fp8.stats.num_kv_pages_used, 0);
}

TEST(KvStoreEngineTest, Fp8RadixPrefixReuseGivesTheTokensOfRecomputing) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(12);
  const std::vector<int32_t> prompt = random_prompt(rng, 45);
  EngineConfig no_reuse = store_config("fp8");
  no_reuse.enable_prefix_caching = false;
  const Generated cached = generate(bundle, store_config("fp8"), {prompt, prompt}, 12);
  const Generated computed = generate(bundle, no_reuse, {prompt, prompt}, 12);
  EXPECT_EQ(cached.num_cached_tokens[1], 44);  // every full page of the prompt
  EXPECT_EQ(computed.num_cached_tokens[1], 0);
  EXPECT_EQ(cached.tokens[1], computed.tokens[1]);
  EXPECT_EQ(cached.tokens[1], cached.tokens[0]);
  EXPECT_EQ(cached.stats.num_kv_pages_used, computed.stats.num_kv_pages_used);
}

// Eviction over FP8 pages: StreamingLLM moves codes as it slides, SnapKV scores the decoded keys at the end of the
// prefill and keeps its budget; generation runs past the budget and the pool is whole after.
TEST(KvStoreEngineTest, EvictionMethodsRunOverFp8Pages) {
  const ModelBundle bundle = tiny_bundle();
  const std::vector<std::pair<std::string, nlohmann::json>> methods = {
      {"streamingllm", {{"budget", 16}, {"sink_tokens", 4}}}, {"snapkv", {{"budget", 16}, {"window", 4}}}};
  for (const auto& [method, method_config] : methods) {
    std::mt19937 rng(13);
    const Generated g = generate(bundle, store_config("fp8", method, method_config),
                                 {random_prompt(rng, 50), random_prompt(rng, 30)}, 20);
    ASSERT_EQ(g.tokens.size(), 2u) << method;
    EXPECT_EQ(g.tokens[0].size(), 20u) << method;
    EXPECT_EQ(g.tokens[1].size(), 20u) << method;
    EXPECT_EQ(g.stats.num_kv_pages_used, 0) << method;
  }
}

// KIVI: with nothing flushed the store is the explicit cache; 4-bit keys and values (beyond a window of 32
// full-precision tokens) pick the explicit cache's next tokens mostly; 2-bit runs; the pool is whole after.
TEST(KvStoreEngineTest, KiviGreedyGenerationStaysCloseToTheExplicitCache) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts(4);
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i] = random_prompt(rng, 40 + 7 * static_cast<int>(i));
  const Generated f32 = generate(bundle, store_config("auto"), prompts, 24);
  // A window longer than every sequence quantizes nothing: the store then answers exactly what fp32 pages do.
  EngineConfig unflushed = store_config("kivi4");
  unflushed.kivi_residual = 128;
  EXPECT_EQ(generate(bundle, unflushed, prompts, 24).tokens, f32.tokens);
  const Generated kivi4 = generate(bundle, store_config("kivi4"), prompts, 24);
  const double agreement = next_token_agreement(bundle, store_config("kivi4"), prompts, f32);
  RecordProperty("kivi4_next_token_agreement", std::to_string(agreement));
  // 81 of 96 (FP8: 87): 4-bit groups of 32 tokens per key channel on this sharp-attention model.
  EXPECT_GE(agreement, 0.8) << "KIVI-4 picks another next token than fp32 too often";
  EXPECT_EQ(kivi4.stats.num_kv_pages_used, 0);
  EXPECT_EQ(kivi4.num_cached_tokens[0], 0);  // no prefix cache over KIVI pages
  const Generated kivi2 = generate(bundle, store_config("kivi2"), prompts, 24);
  for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(kivi2.tokens[r].size(), 24u) << r;
  EXPECT_EQ(kivi2.stats.num_kv_pages_used, 0);
}

TEST(KvStoreEngineTest, RefusesWhatTheStoreCannotTake) {
  const ModelBundle bundle = tiny_bundle();
  auto quest = Engine::create(bundle, store_config("fp8", "quest"));
  ASSERT_FALSE(quest.is_ok());
  EXPECT_EQ(quest.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(quest.status().message().find("update_page_key_bounds"), std::string::npos) << quest.status().message();
  auto snapkv = Engine::create(bundle, store_config("kivi2", "snapkv"));
  ASSERT_FALSE(snapkv.is_ok());
  EXPECT_EQ(snapkv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(snapkv.status().message().find("KIVI"), std::string::npos) << snapkv.status().message();
  EngineConfig radix = store_config("kivi4");
  radix.prefix_cache_mode = "radix";
  EXPECT_EQ(Engine::create(bundle, radix).status().code(), StatusCode::kInvalidArgument);
  EngineConfig ragged = store_config("kivi4");
  ragged.kivi_residual = 40;  // not a multiple of the group
  EXPECT_EQ(Engine::create(bundle, ragged).status().code(), StatusCode::kInvalidArgument);
  auto unknown = Engine::create(bundle, store_config("int3"));
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace se
