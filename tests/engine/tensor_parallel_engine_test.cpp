// The engine under tensor parallelism on the CPU (ranks as threads of one LocalCommGroup): one scheduler plans
// every step, each rank runs it over its part of the model and the KV of its heads, rank 0 samples. Greedy tokens
// and their logprobs at 2 and 4 ranks equal one rank's within fp32 tolerance, for Llama, Qwen3 and Qwen3-MoE under
// vanilla, SnapKV, AdaKV (whose per-layer allocation gathers every rank's scores), Quest, StreamingLLM, the
// decode-time R-KV and Kara (alone and over a prompt method) and KVzip (one threshold over every rank's scores, its
// reconstruction passes on every rank), ShadowKV (one SVD over every rank's keys) and Palu, over a batch of prompts
// scheduled together in chunks; a Chain Cache turn resumes under the same layout; a model loaded from a checkpoint
// splits as the in-memory one does; what cannot be split is refused at startup with its reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../support/engine_runs.h"
#include "../support/tiny_engine.h"
#include "engine/engine.h"
#include "model/tensor_parallel.h"

namespace se {
namespace {

using test::collect;
using test::Generation;
using test::greedy;

// The tiny model of test::tiny_config(model_type) with `overrides`, whose dummy weights are scaled as
// test::tiny_model scales them (greedy choices far from ties).
struct TinySpec {
  std::string model_type = "llama";
  nlohmann::json overrides = nlohmann::json::object();

  nlohmann::json hf() const {
    nlohmann::json c = test::tiny_config(model_type);
    for (const auto& [key, value] : overrides.items()) c[key] = value;
    return c;
  }
};

ModelConfig config_of(const TinySpec& spec) {
  auto normalized = normalize_hf_config(spec.hf(), "tiny");
  SE_CHECK(normalized.is_ok(), "{}", normalized.status().to_string());
  auto config = parse_model_config(*normalized);
  SE_CHECK(config.is_ok(), "{}", config.status().to_string());
  return *config;
}

// The model split over `size` ranks, every rank's part cut from the same weights.
ModelBundle sharded_bundle(const TinySpec& spec, int size) {
  const ModelConfig config = config_of(spec);
  std::map<std::string, Tensor> weights = dummy_weights(config, DType::kF32, 1, nullptr);
  for (auto& [name, t] : weights) {
    if (name.find("norm") != std::string::npos) continue;
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 10.0f;
  }
  ModelBundle bundle;
  bundle.name = "tiny";
  bundle.source_format = "dummy";
  if (size > 1) bundle.rank_group = std::make_unique<LocalCommGroup>(size);
  for (int r = 0; r < size; ++r) {
    Communicator& comm = bundle.rank_group ? bundle.rank_group->communicator(r) : single_rank_communicator();
    auto model = Model::create(config, weights, Device::kCpu, comm);
    SE_CHECK(model.is_ok(), "{}", model.status().to_string());
    auto& slot = r == 0 ? bundle.model : bundle.other_ranks.emplace_back();
    slot = std::make_unique<Model>(std::move(model).value());
  }
  return bundle;
}

EngineConfig engine_config(int size, const std::string& method, const nlohmann::json& method_config) {
  EngineConfig config;
  config.tensor_parallel_size = size;
  config.sparse_method = method;
  config.sparse_config = method_config;
  config.max_num_batched_tokens = 64;  // the prompts arrive in chunks, beside other requests' decode tokens
  config.kv_cache_memory = int64_t{64} << 20;
  return config;
}

std::vector<std::vector<int32_t>> random_prompts(int vocab, const std::vector<int>& lengths) {
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  for (int length : lengths) {
    std::vector<int32_t>& p = prompts.emplace_back(static_cast<size_t>(length));
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % static_cast<unsigned>(vocab));
  }
  return prompts;
}

// Every prompt submitted at once (batched, prefilled in chunks), each generating `max_tokens` greedy tokens with
// their logprobs.
std::vector<Generation> generate_batch(const ModelBundle& bundle, const EngineConfig& config,
                                       const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  auto engine = Engine::create(bundle, config);
  SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
  std::vector<GenerationRequest> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams params = greedy(max_tokens);
    params.logprobs = 0;
    batch.push_back({"r" + std::to_string(i), prompts[i], params, std::nullopt});
  }
  auto streams = (*engine)->submit_batch(std::move(batch));
  SE_CHECK(streams.is_ok(), "{}", streams.status().to_string());
  std::vector<Generation> out;
  for (auto& stream : *streams) out.push_back(collect(*stream));
  (*engine)->shutdown(/*drain=*/true);
  const EngineStats stats = (*engine)->stats();
  EXPECT_EQ(stats.num_kv_pages_used, 0) << "pages left held";
  return out;
}

void expect_same_generations(const std::vector<Generation>& expected, const std::vector<Generation>& actual,
                             const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i].tokens, actual[i].tokens) << what << ", request " << i;
    ASSERT_EQ(expected[i].logprobs.size(), actual[i].logprobs.size()) << what << ", request " << i;
    for (size_t t = 0; t < expected[i].logprobs.size(); ++t) {
      const float want = expected[i].logprobs[t];
      EXPECT_NEAR(want, actual[i].logprobs[t], 1e-4f * std::max(1.0f, std::abs(want)))
          << what << ", request " << i << " token " << t;
    }
  }
}

struct Case {
  std::string label;
  TinySpec model;
  std::string method;
  nlohmann::json method_config;
  std::vector<int> sizes;
  int max_tokens = 10;  // decode-time methods compress the generated part only once it is long enough
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }
};

class TensorParallelEngineTest : public testing::TestWithParam<Case> {};

TEST_P(TensorParallelEngineTest, GreedyTokensAndLogprobsEqualOneRanks) {
  const Case& c = GetParam();
  // Prompts beyond the methods' budgets, of lengths that end pages and chunks at different places.
  const std::vector<std::vector<int32_t>> prompts = random_prompts(96, {90, 57, 120, 12});
  const int num_tokens = c.max_tokens;
  const std::vector<Generation> one =
      generate_batch(sharded_bundle(c.model, 1), engine_config(1, c.method, c.method_config), prompts, num_tokens);
  if (c.method != "vanilla") {
    // The method changes what the model reads, so a rank that decided alone would show.
    const std::vector<Generation> dense =
        generate_batch(sharded_bundle(c.model, 1), engine_config(1, "vanilla", nullptr), prompts, num_tokens);
    bool differs = false;
    for (size_t i = 0; i < prompts.size(); ++i) differs |= dense[i].logprobs != one[i].logprobs;
    EXPECT_TRUE(differs) << c.method << " left every logprob as dense attention has it";
  }
  for (int size : c.sizes) {
    const std::vector<Generation> sharded = generate_batch(
        sharded_bundle(c.model, size), engine_config(size, c.method, c.method_config), prompts, num_tokens);
    expect_same_generations(one, sharded, c.label + " over " + std::to_string(size) + " ranks");
  }
}

// Four KV heads, so four ranks each hold a whole query group (the scoring methods need that).
const nlohmann::json kFourKvHeads = {{"num_key_value_heads", 4}};
const nlohmann::json kSnap = {{"budget", 32}, {"window", 8}};
const nlohmann::json kChunk = {{"budget", 32}, {"window", 8}, {"chunk_length", 4}};
// Budgets that compress the generated part several times within 16 decoded tokens.
const nlohmann::json kRkv = {{"budget", 4}, {"buffer", 2}, {"window", 2}, {"kernel", 3}};
const nlohmann::json kKara = {{"window", 4}, {"buffer", 2}, {"candidates", 2}, {"budget", 3}, {"period", 2}};
// Prompts of 57 tokens and more sketched: 10 landmarks per head and more, 4 chunks read, rank 8.
const nlohmann::json kShadow = {{"sparse_budget", 16}, {"chunk_size", 4},     {"rank", 8},
                                {"local_chunks", 2},   {"outlier_chunks", 2}, {"min_prompt_tokens", 32}};

// `decode_config` with `prompt_method` compressing the prompt first.
nlohmann::json composed(nlohmann::json decode_config, const std::string& prompt_method,
                        const nlohmann::json& prompt_config) {
  decode_config["prompt_method"] = prompt_method;
  decode_config["prompt_config"] = prompt_config;
  return decode_config;
}

INSTANTIATE_TEST_SUITE_P(
    Methods, TensorParallelEngineTest,
    testing::Values(
        Case{"llama_vanilla", {"llama"}, "vanilla", nullptr, {2, 4}},
        Case{"qwen3_vanilla", {"qwen3"}, "vanilla", nullptr, {2, 4}},
        Case{"qwen3_moe_vanilla", {"qwen3_moe"}, "vanilla", nullptr, {2, 4}},
        Case{"llama_snapkv", {"llama", kFourKvHeads}, "snapkv", kSnap, {2, 4}},
        Case{"qwen3_moe_snapkv", {"qwen3_moe"}, "snapkv", kSnap, {2}},
        Case{"llama_adakv", {"llama", kFourKvHeads}, "adakv", kSnap, {2, 4}},
        Case{"llama_adakv_reference",
             {"llama", kFourKvHeads},
             "adakv",
             {{"budget", 32}, {"window", 8}, {"variant", "adakv_reference"}},
             {2}},
        Case{"qwen3_adakv", {"qwen3"}, "adakv", kSnap, {2}},
        Case{"llama_quest", {"llama", kFourKvHeads}, "quest", {{"token_budget", 32}, {"dense_layers", 0}}, {2, 4}},
        Case{"qwen3_moe_quest", {"qwen3_moe"}, "quest", {{"token_budget", 32}, {"dense_layers", 0}}, {2}},
        Case{"llama_streamingllm", {"llama"}, "streamingllm", {{"budget", 32}, {"sink_tokens", 4}}, {2, 4}},
        Case{"llama_pyramidkv", {"llama", kFourKvHeads}, "pyramidkv", kSnap, {2, 4}},
        Case{"qwen3_moe_pyramidkv", {"qwen3_moe"}, "pyramidkv", kSnap, {2}},
        // Chunks ranked over the layer's heads: a rank that ranked its own heads' scores would keep other chunks.
        Case{"llama_chunkkv", {"llama", kFourKvHeads}, "chunkkv", kChunk, {2, 4}},
        Case{"qwen3_chunkkv", {"qwen3"}, "chunkkv", kChunk, {2}},
        Case{"llama_h2o", {"llama", kFourKvHeads}, "h2o", {{"budget", 32}}, {2, 4}},
        // One index of prompt tokens for every head, by the max over all query heads: the ranks join theirs.
        Case{"llama_omnikv",
             {"llama", kFourKvHeads},
             "omnikv",
             {{"filter_layers", {0}}, {"num_wait", 0}, {"num_selected_tokens", 16}},
             {2, 4}},
        // Latent attention: every rank keeps the whole shared latent for its heads; H2O keeps each head's expanded
        // K/V, which the ranks split.
        Case{"deepseek_v2_vanilla", {"deepseek_v2"}, "vanilla", nullptr, {2, 4}},
        Case{"deepseek_v2_streamingllm", {"deepseek_v2"}, "streamingllm", {{"budget", 32}, {"sink_tokens", 4}}, {2, 4}},
        Case{"deepseek_v2_h2o", {"deepseek_v2"}, "h2o", {{"budget", 32}}, {2}},
        // Decode-time compression: each rank rescores its own heads' generated tokens with its query heads.
        Case{"llama_rkv", {"llama", kFourKvHeads}, "rkv", kRkv, {2, 4}, 16},
        Case{"qwen3_rkv", {"qwen3"}, "rkv", kRkv, {2}, 16},
        // The prompt method's chunks are ranked over every rank's heads: it joins the ranks through the
        // communicator the decode-time method hands on.
        Case{"llama_rkv_chunkkv", {"llama", kFourKvHeads}, "rkv", composed(kRkv, "chunkkv", kChunk), {2, 4}, 16},
        Case{"llama_kara", {"llama", kFourKvHeads}, "kara", kKara, {2, 4}, 16},
        Case{"qwen3_kara", {"qwen3"}, "kara", kKara, {2}, 16},
        Case{"qwen3_kara_chunkkv", {"qwen3"}, "kara", composed(kKara, "chunkkv", kChunk), {2}, 16},
        Case{"llama_kara_snapkv", {"llama", kFourKvHeads}, "kara", composed(kKara, "snapkv", kSnap), {2, 4}, 16},
        // One threshold over every (layer, KV head, token) score: a rank that took its own heads' n-th largest
        // would keep other pairs. Every rank runs the reconstruction passes, whose forwards are collectives.
        Case{"llama_kvzip",
             {"llama", kFourKvHeads},
             "kvzip",
             {{"ratio", 0.3}, {"chunk_size", 32}, {"n_sink", 4}},
             {2, 4}},
        Case{"qwen3_kvzip", {"qwen3"}, "kvzip", {{"ratio", 0.3}, {"chunk_size", 32}, {"n_sink", 4}}, {2}},
        Case{"llama_kvzip_uniform",
             {"llama", kFourKvHeads},
             "kvzip",
             {{"ratio", 0.3}, {"chunk_size", 32}, {"level", "pair-uniform"}},
             {2}},
        // One SVD over the keys of the layer's every KV head: a rank that factored its own heads' keys would
        // rebuild other keys.
        Case{"llama_shadowkv", {"llama", kFourKvHeads}, "shadowkv", kShadow, {2, 4}},
        Case{"qwen3_shadowkv", {"qwen3"}, "shadowkv", kShadow, {2}},
        // Low-rank KV: each rank factors its own KV heads' groups of W_k and W_v.
        Case{"llama_palu", {"llama", kFourKvHeads}, "palu", {{"head_group_size", 2}, {"rank_ratio", 0.25}}, {2}},
        Case{"llama_palu_per_head",
             {"llama", kFourKvHeads},
             "palu",
             {{"head_group_size", 1}, {"rank_ratio", 0.25}},
             {2, 4}},
        Case{"qwen3_palu", {"qwen3"}, "palu", {{"head_group_size", 1}, {"rank_ratio", 0.25}}, {2}}),
    [](const testing::TestParamInfo<Case>& info) { return info.param.label; });

// AdaKV leaves the two KV heads of a layer with different lengths; each of two ranks holds one of them, whose
// streams alone are always equal, so only asking every rank keeps the resumed turn uncompressed as one rank keeps it.
// Over KIVI (R = 64) turn 2 brings layer 0's first head to 65 tokens, some of them quantized, and leaves every stream
// of the other rank below R: the rank that could evict must not compress alone either.
class TensorParallelChainTest : public testing::TestWithParam<const char*> {};

TEST_P(TensorParallelChainTest, ChainTurnResumesUnderTheSameLayout) {
  const TinySpec spec{"llama"};
  const std::vector<std::vector<int32_t>> prompts = random_prompts(96, {70, 25});
  std::vector<Generation> turns[2];
  for (int size : {1, 2}) {
    const ModelBundle bundle = sharded_bundle(spec, size);
    EngineConfig config = engine_config(size, "adakv", kSnap);
    config.prefix_cache_mode = "chain";
    config.kv_cache_dtype = GetParam();
    config.kivi_group_size = 32;
    config.kivi_residual = 64;
    auto engine = Engine::create(bundle, config);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    auto first = (*engine)->submit({"t1", prompts[0], greedy(6), ChainRequest{"c", /*create=*/true}});
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    const Generation turn1 = collect(**first);
    std::vector<int32_t> prompt2 = prompts[0];
    prompt2.insert(prompt2.end(), turn1.tokens.begin(), turn1.tokens.end());
    prompt2.insert(prompt2.end(), prompts[1].begin(), prompts[1].end());
    SamplingParams params = greedy(8);
    params.logprobs = 0;
    auto second = (*engine)->submit({"t2", prompt2, params, ChainRequest{"c"}});
    ASSERT_TRUE(second.is_ok()) << second.status().to_string();
    const Generation turn2 = collect(**second);
    EXPECT_EQ(turn2.last.chain_status, ChainStatus::kResumed) << size << " ranks";
    EXPECT_EQ(turn2.last.num_cached_tokens, static_cast<int>(prompts[0].size()) + 5) << size << " ranks";
    turns[size - 1] = {turn1, turn2};
  }
  expect_same_generations(turns[0], turns[1], "chain turns over 2 ranks");
}

INSTANTIATE_TEST_SUITE_P(Stores, TensorParallelChainTest, testing::Values("auto", "kivi4"),
                         [](const testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// A dummy checkpoint (config.json) in a fresh directory, loaded as `sparse-engine --load-format dummy` loads it.
Result<ModelBundle> load_dummy(const TinySpec& spec, int size) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("se_tp_" + std::to_string(::getpid()) + "_" + spec.model_type);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << spec.hf().dump();
  LoadOptions options;
  options.format = LoadFormat::kDummy;
  options.seed = 3;
  return ModelBundle::load((dir / "config.json").string(), options, Device::kCpu, size);
}

TEST(TensorParallelEngineTest, ALoadedModelSplitsAsTheWholeOneRuns) {
  const TinySpec spec{"qwen3_moe"};
  auto whole = load_dummy(spec, 1);
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  auto split = load_dummy(spec, 2);
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  ASSERT_EQ(split->tensor_parallel_size(), 2);
  EXPECT_EQ(split->rank_model(1).config().num_heads, whole->model->config().num_heads / 2);
  const std::vector<std::vector<int32_t>> prompts = random_prompts(96, {40, 9});
  expect_same_generations(generate_batch(*whole, engine_config(1, "vanilla", nullptr), prompts, 6),
                          generate_batch(*split, engine_config(2, "vanilla", nullptr), prompts, 6),
                          "loaded over 2 ranks");
}

TEST(TensorParallelEngineTest, RanksThatDoNotDivideTheHeadsAreRefusedAtLoad) {
  auto three = load_dummy(TinySpec{"llama"}, 3);
  ASSERT_FALSE(three.is_ok());
  EXPECT_NE(three.status().message().find("does not divide the model's 4 attention heads"), std::string::npos)
      << three.status().to_string();
  EXPECT_EQ(load_dummy(TinySpec{"llama"}, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(TensorParallelEngineTest, WhatCannotRunSplitIsRefusedAtStartup) {
  const ModelBundle two = sharded_bundle(TinySpec{"llama"}, 2);
  // Palu's groups of KV heads are the whole model's: one that spans the ranks (both KV heads, one on each rank)
  // cannot be factored by either.
  auto palu = Engine::create(two, engine_config(2, "palu", {{"head_group_size", 2}}));
  ASSERT_FALSE(palu.is_ok());
  EXPECT_EQ(palu.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(palu.status().message().find("a group of 2 KV heads spans tensor-parallel ranks"), std::string::npos)
      << palu.status().to_string();
  // The engine's rank count must be the model's.
  EXPECT_EQ(Engine::create(two, engine_config(1, "vanilla", nullptr)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Engine::create(sharded_bundle(TinySpec{"llama"}, 1), engine_config(2, "vanilla", nullptr)).status().code(),
            StatusCode::kInvalidArgument);
  EngineConfig offloading = engine_config(2, "snapkv", kSnap);
  offloading.kv_offloading_size = int64_t{1} << 20;
  EXPECT_EQ(Engine::create(two, offloading).status().code(), StatusCode::kUnimplemented);

  // Four ranks over two KV heads: each KV head is kept by two ranks, each with half its query group, so a
  // method that scores a KV head with its query heads cannot; vanilla can.
  const ModelBundle four = sharded_bundle(TinySpec{"llama"}, 4);
  auto snapkv = Engine::create(four, engine_config(4, "snapkv", kSnap));
  ASSERT_FALSE(snapkv.is_ok());
  EXPECT_EQ(snapkv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(snapkv.status().message().find("4 ranks split the model's 2 KV heads"), std::string::npos)
      << snapkv.status().to_string();
  EXPECT_TRUE(Engine::create(four, engine_config(4, "vanilla", nullptr)).is_ok());

  // A method that scores a latent-attention model's shared latent reads every query head, which the ranks split.
  auto latent = Engine::create(sharded_bundle(TinySpec{"deepseek_v2"}, 2), engine_config(2, "snapkv", kSnap));
  ASSERT_FALSE(latent.is_ok());
  EXPECT_NE(latent.status().message().find("snapkv scores the shared latent"), std::string::npos)
      << latent.status().to_string();
}

}  // namespace
}  // namespace se
