// Spin's partitions inside the engine (--kv-partitions): Quest over running sequences whose KV lives in the host
// tier page by page, on the tiny model, against the engine's Quest with every page resident. The device pool is
// smaller than the sequences' KV together (or than one sequence's), so their pages move every step; the greedy
// tokens and log-probabilities are resident Quest's. Requests that can never fit are refused at submit, others
// unaffected; the options a partitioned engine cannot run are refused before a model loads. OmniKV's and ShadowKV's
// token selections decode as the resident methods do too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../support/engine_runs.h"
#include "../support/tiny_engine.h"
#include "engine/engine.h"
#include "sparse/method_registry.h"

namespace se {
namespace {

using test::collect;
using test::Generation;
using test::greedy;
using test::tiny_bundle;

constexpr int32_t kPageSize = 16;
constexpr int kMaxTokens = 12;
// The tiny model's pages: 2 layers x 2 KV heads of 16 fp32 channels, K and V; Quest bounds 2 x 16 fp32 per page.
constexpr int64_t kPageBytes = 2 * kPageSize * 16 * 4;
constexpr int64_t kQuestPageBytes = kPageBytes + 2 * 16 * 4;
constexpr int64_t kDevicePages = 64;

struct Runs {
  std::vector<Generation> generations;
  EngineStats end;  // once drained
};

EngineConfig quest_config(int dense_layers) {
  EngineConfig config;
  config.page_size = kPageSize;
  config.sparse_method = "quest";
  config.sparse_config = {{"token_budget", 2 * kPageSize}, {"dense_layers", dense_layers}};
  return config;
}

// Device pool of kDevicePages pages, a host tier of `host_pages`, steps of at most 32 tokens.
EngineConfig partitioned_config(int dense_layers, int64_t host_pages = 512) {
  EngineConfig config = quest_config(dense_layers);
  config.kv_cache_memory = kDevicePages * kQuestPageBytes;
  config.kv_offloading_size = host_pages * kPageBytes;
  config.kv_partitions = true;
  config.max_num_batched_tokens = 32;
  return config;
}

// The prompts submitted together (together = false: one after another, each alone in the engine).
Runs run(const ModelBundle& bundle, const EngineConfig& config, const std::vector<std::vector<int32_t>>& prompts,
         bool together) {
  auto engine = Engine::create(bundle, config);
  SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
  Runs runs;
  std::vector<std::shared_ptr<OutputStream>> streams;
  std::vector<GenerationRequest> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams params = greedy(kMaxTokens);
    params.logprobs = 0;
    batch.push_back({"r" + std::to_string(i), prompts[i], params});
    if (together) continue;
    auto stream = (*engine)->submit(std::move(batch.back()));
    SE_CHECK(stream.is_ok(), "{}", stream.status().to_string());
    runs.generations.push_back(collect(**stream));
  }
  if (together) {
    auto submitted = (*engine)->submit_batch(std::move(batch));
    SE_CHECK(submitted.is_ok(), "{}", submitted.status().to_string());
    for (auto& stream : *submitted) runs.generations.push_back(collect(*stream));
  }
  (*engine)->shutdown(/*drain=*/true);
  runs.end = (*engine)->stats();
  return runs;
}

void expect_same_generations(const Runs& got, const Runs& want) {
  ASSERT_EQ(got.generations.size(), want.generations.size());
  for (size_t r = 0; r < want.generations.size(); ++r) {
    const Generation& g = got.generations[r];
    const Generation& w = want.generations[r];
    EXPECT_EQ(g.tokens, w.tokens) << "prompt " << r;
    ASSERT_EQ(g.logprobs.size(), w.logprobs.size());
    for (size_t t = 0; t < w.logprobs.size(); ++t)
      EXPECT_NEAR(g.logprobs[t], w.logprobs[t], 1e-4f * std::max(1.0f, std::abs(w.logprobs[t])))
          << "prompt " << r << " token " << t;
  }
}

std::vector<std::vector<int32_t>> random_prompts(std::initializer_list<int32_t> lengths, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t length : lengths) {
    std::vector<int32_t> prompt(static_cast<size_t>(length));
    for (int32_t& token : prompt) token = static_cast<int32_t>(rng() % 96);
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

// KV pages of the prompts' sequences at their peak, over the tiny model's 4 streams.
int64_t kv_pages(const std::vector<std::vector<int32_t>>& prompts) {
  int64_t pages = 0;
  for (const auto& prompt : prompts)
    pages += 4 * ((static_cast<int64_t>(prompt.size()) + kMaxTokens + kPageSize - 1) / kPageSize);
  return pages;
}

class KvPartitionsEngineTest : public ::testing::Test {
 protected:
  // `method` under the partitions, over a device pool smaller than the prompts' KV (the method keeps no per-page
  // metadata), gives the tokens and log-probabilities of the method resident; the partitioned run.
  Runs expect_partitions_decode_as_resident(const std::string& method, const nlohmann::json& method_config,
                                            const std::vector<std::vector<int32_t>>& prompts) {
    EngineConfig resident;
    resident.page_size = kPageSize;
    resident.sparse_method = method;
    resident.sparse_config = method_config;
    const Runs reference = run(bundle_, resident, prompts, /*together=*/false);
    EngineConfig config = partitioned_config(0);
    config.sparse_method = method;
    config.sparse_config = method_config;
    config.kv_cache_memory = kDevicePages * kPageBytes;
    EXPECT_GT(kv_pages(prompts), kDevicePages);
    Runs partitioned = run(bundle_, config, prompts, /*together=*/true);
    expect_same_generations(partitioned, reference);
    EXPECT_GT(partitioned.end.num_kv_host_pages_used_peak, 0);
    return partitioned;
  }

  const ModelBundle bundle_ = tiny_bundle();
};

TEST_F(KvPartitionsEngineTest, ServesMoreSequencesThanTheDevicePoolHoldsAsResidentQuest) {
  const auto prompts = random_prompts({97, 130, 151}, 35);
  ASSERT_GT(kv_pages(prompts), kDevicePages);
  const Runs reference = run(bundle_, quest_config(0), prompts, /*together=*/false);
  const Runs partitioned = run(bundle_, partitioned_config(0), prompts, /*together=*/true);
  expect_same_generations(partitioned, reference);
  EXPECT_GT(partitioned.end.num_kv_host_pages_used_peak, 0) << "the host tier held running sequences' pages";
  EXPECT_EQ(partitioned.end.preemptions_total, 0u);
}

TEST_F(KvPartitionsEngineTest, ServesASequenceLongerThanTheDevicePool) {
  const auto prompts = random_prompts({400}, 36);
  ASSERT_GT(kv_pages(prompts), kDevicePages);
  const Runs reference = run(bundle_, quest_config(0), prompts, /*together=*/false);
  const Runs partitioned = run(bundle_, partitioned_config(0), prompts, /*together=*/false);
  expect_same_generations(partitioned, reference);
  EXPECT_GT(partitioned.end.num_kv_host_pages_used_peak, 0);
}

TEST_F(KvPartitionsEngineTest, AFixedBufferAndADenseLayerDecodeAsResidentQuest) {
  const auto prompts = random_prompts({97, 130, 151}, 37);
  const Runs reference = run(bundle_, quest_config(1), prompts, /*together=*/false);
  EngineConfig config = partitioned_config(1);
  config.kv_partition_fixed_pages = 8;  // two layers' selections (2 KV heads x 2 pages each)
  expect_same_generations(run(bundle_, config, prompts, /*together=*/true), reference);
}

// Spin's two-level ranking (two_level_group): with every group kept it is flat Quest, so it decodes as resident Quest;
// with fewer kept it approximates it and still serves every request and gives both pools back.
TEST_F(KvPartitionsEngineTest, TheTwoLevelRankingWithEveryGroupKeptDecodesAsResidentQuest) {
  const auto prompts = random_prompts({97, 130, 151}, 41);
  const Runs reference = run(bundle_, quest_config(0), prompts, /*together=*/false);
  EngineConfig config = partitioned_config(0);
  // Groups of 2 pages: the longest stream (163 tokens, 11 pages) ranks 10 candidates in 5 groups.
  config.sparse_config["two_level_group"] = 2;
  config.sparse_config["two_level_kept_groups"] = 5;
  const Runs every_group = run(bundle_, config, prompts, /*together=*/true);
  expect_same_generations(every_group, reference);
  EXPECT_GT(every_group.end.num_kv_host_pages_used_peak, 0);

  config.sparse_config["two_level_kept_groups"] = 1;
  const Runs one_group = run(bundle_, config, prompts, /*together=*/true);
  ASSERT_EQ(one_group.generations.size(), prompts.size());
  for (const Generation& g : one_group.generations) EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kMaxTokens));
  // It reaches the partitions' ranking: reading the pages of one group changes what the requests attend to.
  bool any_differs = false;
  for (size_t r = 0; r < prompts.size(); ++r)
    any_differs |= one_group.generations[r].logprobs != reference.generations[r].logprobs;
  EXPECT_TRUE(any_differs);
  EXPECT_GT(one_group.end.num_kv_host_pages_used_peak, 0);
  EXPECT_EQ(one_group.end.num_kv_pages_free, one_group.end.num_kv_pages_total);
  EXPECT_EQ(one_group.end.num_kv_host_pages_used, 0);
}

TEST_F(KvPartitionsEngineTest, TheTwoLevelRankingIsValidatedAndRunsOnlyUnderThePartitions) {
  const auto quest = [](const nlohmann::json& sparse_config) { return create_method("quest", sparse_config).status(); };
  EXPECT_EQ(quest({{"two_level_group", -1}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(quest({{"two_level_group", 2}, {"two_level_kept_groups", 0}}).code(), StatusCode::kInvalidArgument);
  const Status kept_alone = quest({{"two_level_kept_groups", 2}});
  EXPECT_EQ(kept_alone.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kept_alone.message().find("two_level_group"), std::string::npos) << kept_alone.to_string();
  EXPECT_TRUE(quest({{"two_level_group", 4}, {"two_level_kept_groups", 2}}).is_ok());
  // Either resolved config, flat or two-level, is taken back as given.
  for (const nlohmann::json& given : {nlohmann::json(nullptr), nlohmann::json{{"two_level_group", 4}}}) {
    auto made = create_method("quest", given);
    ASSERT_TRUE(made.is_ok());
    EXPECT_TRUE(quest(nlohmann::json((*made)->config())).is_ok()) << (*made)->config().dump();
  }

  EngineConfig resident = quest_config(0);
  resident.sparse_config["two_level_group"] = 2;
  auto method = create_method(resident.sparse_method, resident.sparse_config);
  ASSERT_TRUE(method.is_ok()) << method.status().to_string();
  const Status refused = check_kv_partitions(resident, **method);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("--kv-partitions"), std::string::npos) << refused.to_string();
  EXPECT_EQ(Engine::create(bundle_, resident).status().code(), StatusCode::kInvalidArgument);

  EngineConfig partitioned = partitioned_config(0);
  partitioned.sparse_config["two_level_group"] = 2;
  EXPECT_TRUE(check_kv_partitions(partitioned, **method).is_ok());
  // The ranking is host code over fp32 bounds.
  const KvLayout f16{.num_layers = 2, .num_kv_heads = 2, .head_dim = 16, .page_size = kPageSize, .dtype = DType::kF16};
  EXPECT_EQ(engine_partition_config(partitioned, **method, f16).status().code(), StatusCode::kUnimplemented);
}

TEST_F(KvPartitionsEngineTest, PreemptsWhenBothPoolsRunShortAndLeavesThemWhole) {
  const auto prompts = random_prompts({97, 130, 151}, 40);
  const Runs reference = run(bundle_, quest_config(0), prompts, /*together=*/false);
  // 64 device and 40 host pages, less 4 kept free and the indexes' pages, against 104 pages of prompts: the newest
  // request gives way, and with no room left on the host to keep it, is recomputed later.
  const Runs partitioned = run(bundle_, partitioned_config(0, /*host_pages=*/40), prompts, /*together=*/true);
  EXPECT_GT(partitioned.end.preemptions_total, 0u);
  // The oldest request never gives way: its run is uninterrupted. A recomputed one prefills its outputs densely
  // where they were decoded through Quest's selection, so its later tokens may differ.
  ASSERT_EQ(partitioned.generations.size(), 3u);
  EXPECT_EQ(partitioned.generations[0].tokens, reference.generations[0].tokens);
  for (const Generation& g : partitioned.generations) EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kMaxTokens));
  EXPECT_EQ(partitioned.end.num_kv_pages_free, partitioned.end.num_kv_pages_total);
  EXPECT_EQ(partitioned.end.num_kv_host_pages_used, 0);
}

TEST_F(KvPartitionsEngineTest, OmniKvsTokenSelectionDecodesAsResidentOmniKv) {
  // Layer 0 filters (16 prompt tokens kept), layer 1 reads them and the decode tail.
  const nlohmann::json omnikv = {{"filter_layers", {0}}, {"num_wait", 0}, {"num_selected_tokens", 16}};
  expect_partitions_decode_as_resident("omnikv", omnikv, random_prompts({97, 130, 151}, 39));
}

TEST_F(KvPartitionsEngineTest, ShadowKvsChunkSelectionDecodesAsResidentShadowKv) {
  // Chunks of 8 tokens (half a page), 2 local and 2 outlier chunks, 2 chunks chosen per step, keys of rank 8 of 32:
  // each decode step reads 7 chunks per KV head of the prompts' 10-16 sketched ones, and the decode tail.
  const nlohmann::json shadowkv = {{"sparse_budget", 16}, {"chunk_size", 8},     {"rank", 8},
                                   {"local_chunks", 2},   {"outlier_chunks", 2}, {"min_prompt_tokens", 64}};
  const auto prompts = random_prompts({97, 130, 151}, 41);
  const Runs partitioned = expect_partitions_decode_as_resident("shadowkv", shadowkv, prompts);
  // The chunks narrow what decode reads: fewer KV tokens than the same requests under dense reads.
  EngineConfig dense = partitioned_config(0);
  dense.sparse_method = "shadowkv";
  dense.sparse_config = shadowkv;
  dense.sparse_config["min_prompt_tokens"] = 1000;
  dense.kv_cache_memory = kDevicePages * kPageBytes;
  EXPECT_LT(partitioned.end.attended_kv_tokens_total, run(bundle_, dense, prompts, true).end.attended_kv_tokens_total);
}

TEST_F(KvPartitionsEngineTest, RefusesRequestsThatCanNeverFitAndServesTheOthers) {
  const auto prompts = random_prompts({97}, 38);
  const Runs reference = run(bundle_, quest_config(0), prompts, /*together=*/false);
  // A host tier of 16 pages: 64 + 16 - 4 (one layer's selection kept free) pages for a sequence's KV.
  auto engine = Engine::create(bundle_, partitioned_config(0, /*host_pages=*/16));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  // 1,000 tokens: a layer read whole is 2 x 63 pages, more than the device pool.
  auto too_wide = (*engine)->submit({"wide", random_prompts({1000}, 1)[0], greedy(kMaxTokens)});
  ASSERT_EQ(too_wide.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_wide.status().message().find("working set"), std::string::npos) << too_wide.status().to_string();
  // 400 tokens: its working set fits the device (2 x 26 pages and 8 of metadata), its 104 pages not the two pools.
  auto too_long = (*engine)->submit({"long", random_prompts({400}, 2)[0], greedy(kMaxTokens)});
  ASSERT_EQ(too_long.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_long.status().message().find("host tier"), std::string::npos) << too_long.status().to_string();
  SamplingParams params = greedy(kMaxTokens);
  params.logprobs = 0;
  auto fits = (*engine)->submit({"fits", prompts[0], params});
  ASSERT_TRUE(fits.is_ok()) << fits.status().to_string();
  Runs served;
  served.generations.push_back(collect(**fits));
  (*engine)->shutdown(/*drain=*/true);
  expect_same_generations(served, reference);
}

TEST_F(KvPartitionsEngineTest, RefusesWhatThePartitionsCannotRun) {
  const auto check = [](const EngineConfig& config) {
    auto method = create_method(config.sparse_method, config.sparse_config);
    SE_CHECK(method.is_ok(), "{}", method.status().to_string());
    return check_kv_partitions(config, **method);
  };
  EngineConfig config = partitioned_config(0);
  EXPECT_TRUE(check(config).is_ok());
  EngineConfig no_tier = config;
  no_tier.kv_offloading_size = 0;
  EXPECT_EQ(check(no_tier).code(), StatusCode::kInvalidArgument);
  EngineConfig dense = config;
  dense.sparse_method = "vanilla";
  dense.sparse_config = nullptr;
  EXPECT_EQ(check(dense).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(check(dense).message().find("cannot run its decode as Spin's partitions"), std::string::npos);
  EngineConfig radix = config;
  radix.prefix_cache_mode = "radix";
  EXPECT_EQ(check(radix).code(), StatusCode::kInvalidArgument);
  EngineConfig chain = config;
  chain.prefix_cache_mode = "chain";
  EXPECT_TRUE(check(chain).is_ok()) << "a finished turn is kept whole in the tier";
  EngineConfig shadowkv = config;
  shadowkv.sparse_method = "shadowkv";
  shadowkv.sparse_config = nullptr;
  EXPECT_TRUE(check(shadowkv).is_ok()) << "its chunks are a token selection of its own";
  // Its sketch, beside the pool, is held as metadata pages as a sequence grows: a landmark of 16 fp32 channels and
  // its id per chunk of 8 tokens, 136 bytes per page of 16.
  auto sketching = create_method("shadowkv", nullptr);
  ASSERT_TRUE(sketching.is_ok());
  const KvLayout f32{.num_layers = 2, .num_kv_heads = 2, .head_dim = 16, .page_size = kPageSize, .dtype = DType::kF32};
  EXPECT_EQ(engine_partition_config(shadowkv, **sketching, f32)->state_bytes_per_page, 136);
  EngineConfig fp8 = config;
  fp8.kv_cache_dtype = "fp8";
  EXPECT_EQ(check(fp8).code(), StatusCode::kUnimplemented);
  EngineConfig fraction = config;
  fraction.sparse_method = "omnikv";
  fraction.sparse_config = {{"selected_fraction", 0.1}};
  EXPECT_EQ(check(fraction).code(), StatusCode::kInvalidArgument) << "no page bound before the prompt comes";
  EngineConfig small_fixed = config;
  small_fixed.kv_partition_fixed_pages = 3;  // one layer's selection is 2 KV heads x 2 pages
  EXPECT_EQ(Engine::create(bundle_, small_fixed).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace se
