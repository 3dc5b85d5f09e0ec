// shadowkv through the Engine on the tiny model (2 layers, 2 KV heads of 16, pages of 4, prompts in chunks): at
// full rank with a budget that reads every chunk the rewritten keys are the model's own (greedy tokens equal
// vanilla's); at a generous budget and rank it stays close to vanilla; a prompt below min_prompt_tokens runs
// dense; sliding-window layers are left alone; the pool is whole after every run, and sized with the sketch's bytes
// set aside beside each page.
#include <gtest/gtest.h>

#include <random>

#include "../support/engine_runs.h"
#include "../support/tiny_engine.h"
#include "engine/engine.h"

namespace se {
namespace {

using test::generate;
using test::Generated;
using test::tiny_bundle;

std::vector<int32_t> random_prompt(std::mt19937& rng, int len) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 96);
  return p;
}

EngineConfig config_for(const std::string& method, const nlohmann::json& method_config = nullptr) {
  EngineConfig config;
  config.sparse_method = method;
  config.sparse_config = method_config;
  config.page_size = 4;
  config.max_num_batched_tokens = 48;  // prompts arrive in several chunks
  config.kv_cache_memory = 8 << 20;
  return config;
}

std::vector<std::vector<int32_t>> prompts() {
  std::mt19937 rng(35);
  std::vector<std::vector<int32_t>> out;
  for (int len : {130, 150, 171}) out.push_back(random_prompt(rng, len));
  return out;
}

// Prompts of 130-171 tokens: with chunks of 8, 2 local and 2 outlier chunks, 12-17 landmarks per head.
nlohmann::json shadowkv_config(int rank, int budget_chunks) {
  return {{"sparse_budget", 8 * budget_chunks},
          {"chunk_size", 8},
          {"rank", rank},
          {"local_chunks", 2},
          {"outlier_chunks", 2},
          {"min_prompt_tokens", 64}};
}

TEST(ShadowKvEngineTest, FullRankAndEveryChunkEqualsVanilla) {
  const ModelBundle bundle = tiny_bundle();
  const Generated vanilla = generate(bundle, config_for("vanilla"), prompts(), 16);
  // Rank 32 = 2 heads x 16: the rebuild is the key itself, up to rounding; 12 chunks: every landmark of the
  // shortest prompt (the longer ones read all but a few).
  const Generated full = generate(bundle, config_for("shadowkv", shadowkv_config(32, 12)), {prompts()[0]}, 16);
  EXPECT_EQ(full.tokens[0], vanilla.tokens[0]);
  EXPECT_EQ(full.stats.num_kv_pages_used, 0);
}

TEST(ShadowKvEngineTest, SlidingWindowLayersStayDense) {
  // Gemma 3's tiny config: every other layer slides over 8 tokens. The full layers are sketched and read as
  // above; the sliding ones are left as they are, so full rank and every chunk still equal vanilla.
  const ModelBundle bundle = tiny_bundle("gemma3_text");
  const auto ps = prompts();
  const Generated vanilla = generate(bundle, config_for("vanilla"), {ps[0]}, 16);
  const Generated full = generate(bundle, config_for("shadowkv", shadowkv_config(32, 12)), {ps[0]}, 16);
  EXPECT_EQ(full.tokens[0], vanilla.tokens[0]);
  const Generated narrow = generate(bundle, config_for("shadowkv", shadowkv_config(2, 1)), ps, 16);
  EXPECT_EQ(narrow.tokens.size(), ps.size());
  EXPECT_EQ(narrow.stats.num_kv_pages_used, 0);
}

TEST(ShadowKvEngineTest, GenerousBudgetStaysCloseToVanilla) {
  const ModelBundle bundle = tiny_bundle();
  const auto ps = prompts();
  const Generated vanilla = generate(bundle, config_for("vanilla"), ps, 16);
  const EngineConfig sparse = config_for("shadowkv", shadowkv_config(24, 8));
  const Generated shadow = generate(bundle, sparse, ps, 16);
  for (size_t r = 0; r < ps.size(); ++r) EXPECT_EQ(shadow.tokens[r][0], vanilla.tokens[r][0]) << r;
  const double agreement = test::next_token_agreement(bundle, sparse, ps, vanilla);
  RecordProperty("shadowkv_next_token_agreement", std::to_string(agreement));
  EXPECT_GE(agreement, 0.8) << "shadowkv picks another next token than vanilla too often";
  EXPECT_EQ(shadow.stats.num_kv_pages_used, 0);
}

TEST(ShadowKvEngineTest, TheSketchIsSetAsideBesideEveryPageOfThePool) {
  // A page of 4 tokens of a 16-wide KV head in fp32 is 512 bytes; the sketch of its half of a chunk of 8 at most
  // half a landmark and its id, (16 x 4 + 4) / 2 = 34 bytes. The budget holds pages with that beside each.
  const ModelBundle bundle = tiny_bundle();
  const std::vector<std::vector<int32_t>> one{prompts()[0]};
  EXPECT_EQ(generate(bundle, config_for("vanilla"), one, 1).stats.num_kv_pages_total, (8 << 20) / 512);
  EXPECT_EQ(generate(bundle, config_for("shadowkv", shadowkv_config(8, 2)), one, 1).stats.num_kv_pages_total,
            (8 << 20) / (512 + 34));
}

TEST(ShadowKvEngineTest, ALowBudgetChangesWhatDecodeReads) {
  // A rank-2 sketch reading one chunk: the decode must differ from vanilla somewhere, or the method reads nothing
  // of its own.
  const ModelBundle bundle = tiny_bundle();
  const auto ps = prompts();
  const Generated vanilla = generate(bundle, config_for("vanilla"), ps, 16);
  const Generated narrow = generate(bundle, config_for("shadowkv", shadowkv_config(2, 1)), ps, 16);
  EXPECT_NE(narrow.tokens, vanilla.tokens);
  EXPECT_EQ(narrow.stats.num_kv_pages_used, 0);
  // Below min_prompt_tokens the same settings leave every prompt dense.
  nlohmann::json dense = shadowkv_config(2, 1);
  dense["min_prompt_tokens"] = 1000;
  EXPECT_EQ(generate(bundle, config_for("shadowkv", dense), ps, 16).tokens, vanilla.tokens);
}

}  // namespace
}  // namespace se
