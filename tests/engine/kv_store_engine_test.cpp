// The --kv-cache-dtype stores through the Engine on the tiny model: FP8 greedy generation stays close to the
// explicit fp32 cache, the pool holds as many more pages as its pages are smaller and is whole after, a prefix
// reused from the radix cache over FP8 pages gives the same tokens as computing it, eviction methods run over FP8
// pages, SnapKV over KIVI keeps the prompt tokens the explicit cache's SnapKV keeps and stores them quantized,
// StreamingLLM over KIVI with a budget past every sequence answers what KIVI alone does and with a small one finishes
// every request within its pages, Quest over FP8 and KIVI pages reads all of them with a budget past every sequence
// and fewer keys with a small one,
// TurboQuant's presets run under vanilla with the radix cache over their slots and under the eviction methods
// whose ops move whole slots and score their keys, and a method or value the store cannot take is refused when the
// engine is built.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "../support/engine_runs.h"
#include "../support/tiny_engine.h"
#include "../support/tiny_model.h"
#include "../loader/safetensors_builder.h"
#include "../loader/test_models.h"
#include "backend/quant/turboquant_kv.h"
#include "engine/engine.h"
#include "engine/teacher_forcing.h"
#include "kv/kv_store_kind.h"
#include "sparse/kivi_cache_manager.h"

namespace se {
namespace {

using test::generate;
using test::Generated;
using test::next_token_agreement;
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

// A repeated prompt over `store`'s pages: the second request reuses every full page of the first through the radix
// cache and generates what recomputing it does.
void expect_radix_reuse_gives_the_tokens_of_recomputing(const std::string& store) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(12);
  const std::vector<int32_t> prompt = random_prompt(rng, 45);
  EngineConfig no_reuse = store_config(store);
  no_reuse.enable_prefix_caching = false;
  const Generated cached = generate(bundle, store_config(store), {prompt, prompt}, 12);
  const Generated computed = generate(bundle, no_reuse, {prompt, prompt}, 12);
  EXPECT_EQ(cached.num_cached_tokens[1], 44);  // every full page of the prompt
  EXPECT_EQ(computed.num_cached_tokens[1], 0);
  EXPECT_EQ(cached.tokens[1], computed.tokens[1]);
  EXPECT_EQ(cached.tokens[1], cached.tokens[0]);
  EXPECT_EQ(cached.stats.num_kv_pages_used, computed.stats.num_kv_pages_used);
}

TEST(KvStoreEngineTest, Fp8RadixPrefixReuseGivesTheTokensOfRecomputing) {
  expect_radix_reuse_gives_the_tokens_of_recomputing("fp8");
}

// The tiny model as an HF checkpoint in `dir`, with `extra` tensors beside its weights.
ModelBundle load_tiny_checkpoint(const std::string& dir, const std::map<std::string, Tensor>& extra,
                                 int tensor_parallel_size = 1) {
  auto normalized = normalize_hf_config(test::tiny_config(), "tiny");
  SE_CHECK(normalized.is_ok(), "{}", normalized.status().to_string());
  auto weights = dummy_weights(*parse_model_config(*normalized), DType::kF32, 1, nullptr);
  for (auto& [name, t] : weights) {
    if (name.find("norm") != std::string::npos) continue;
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 10.0f;
  }
  weights.insert(extra.begin(), extra.end());
  testing::write_hf_dir(testing::scratch_path(dir), test::tiny_config(), weights);
  LoadOptions options;
  options.show_progress = false;
  auto bundle = ModelBundle::load(testing::scratch_path(dir), options, Device::kCpu, tensor_parallel_size);
  SE_CHECK(bundle.is_ok(), "{}", bundle.status().to_string());
  return std::move(bundle).value();
}

Tensor scales_tensor(std::vector<float> v) {
  Tensor t = Tensor::empty(DType::kF32, Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// An FP8 checkpoint's KV cache scales (vLLM's k_scale / v_scale) are what the FP8 store writes and reads with.
// Scales so large that every code is zero read every key and value back as zero, so the tokens are not those of
// the store that calibrates its own; and per-head scales land on the tensor-parallel rank holding their head, so
// two ranks give the tokens of one (a rank reading the other head's scales would zero the wrong values).
TEST(KvStoreEngineTest, Fp8StoreDecodesWithTheCheckpointsScales) {
  std::map<std::string, Tensor> huge, per_head;
  for (int l = 0; l < 2; ++l) {
    const std::string prefix = "model.layers." + std::to_string(l) + ".self_attn.";
    huge[prefix + "k_scale"] = huge[prefix + "v_scale"] = scales_tensor({1e6f});
    per_head[prefix + "k_scale"] = scales_tensor({0.05f, 0.05f});
    per_head[prefix + "v_scale"] = scales_tensor({0.05f, 1e6f});  // KV head 1's values read back as zeros
  }
  const ModelBundle calibrating = load_tiny_checkpoint("fp8_scales_none", {});
  const ModelBundle zeroing = load_tiny_checkpoint("fp8_scales_huge", huge);
  EXPECT_FALSE(calibrating.kv_cache_scales.has_value());
  ASSERT_TRUE(zeroing.kv_cache_scales.has_value());
  EXPECT_EQ(zeroing.kv_cache_scales->k, std::vector<float>(4, 1e6f));
  std::mt19937 rng(17);
  const std::vector<std::vector<int32_t>> prompts = {random_prompt(rng, 20), random_prompt(rng, 33),
                                                     random_prompt(rng, 9)};
  const Generated own = generate(calibrating, store_config("fp8"), prompts, 8);
  const Generated zeros = generate(zeroing, store_config("fp8"), prompts, 8);
  EXPECT_NE(zeros.tokens, own.tokens);
  // The same checkpoint's scales do nothing to the explicit store.
  EXPECT_EQ(generate(zeroing, store_config("auto"), prompts, 8).tokens,
            generate(calibrating, store_config("auto"), prompts, 8).tokens);

  const ModelBundle whole = load_tiny_checkpoint("fp8_scales_per_head", per_head);
  const ModelBundle split = load_tiny_checkpoint("fp8_scales_per_head", per_head, 2);
  EngineConfig two_ranks = store_config("fp8");
  two_ranks.tensor_parallel_size = 2;
  EXPECT_EQ(generate(split, two_ranks, prompts, 8).tokens, generate(whole, store_config("fp8"), prompts, 8).tokens);
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

// Teacher-forced decode agreement of `method` over `store` with the method over explicit fp32 pages: each prompt is
// prefilled and compressed once, the fp32 run's greedy tokens are fed to both, and each decode step's next token is
// compared. Decode reads the kept tokens as the store holds them (re-prompting would not: a prompt's first token is
// computed by the prefill, before anything is compressed or quantized).
double decode_agreement(const Model& model, const std::string& method, const nlohmann::json& method_config,
                        KvStoreKind store, const std::vector<std::vector<int32_t>>& prompts, int num_steps) {
  auto sequence = [&](KvStoreKind kind, size_t prompt_len) {
    TeacherForcingOptions options;
    options.method = method;
    options.config = method_config;
    options.page_size = 4;
    options.prefill_chunk = 32;
    options.max_tokens = static_cast<int32_t>(prompt_len) + num_steps;
    options.store = kind;
    options.kivi_residual = 32;
    auto made = TeacherForcedSequence::create(model, options);
    SE_CHECK(made.is_ok(), "{}", made.status().to_string());
    return std::move(made).value();
  };
  auto argmax = [](const Tensor& logits) {
    const float* x = logits.data<float>();
    return static_cast<int32_t>(std::max_element(x, x + logits.numel()) - x);
  };
  int agree = 0, steps = 0;
  for (const std::vector<int32_t>& prompt : prompts) {
    auto f32 = sequence(KvStoreKind::kExplicit, prompt.size()), quantized = sequence(store, prompt.size());
    int32_t token = argmax(*f32->prefill(prompt));
    EXPECT_EQ(argmax(*quantized->prefill(prompt)), token);  // the prefill attends at full precision
    for (int i = 0; i < num_steps; ++i, ++steps) {
      const int32_t want = argmax(*f32->decode(token));
      agree += argmax(*quantized->decode(token)) == want ? 1 : 0;
      token = want;
    }
    // Both hold as many tokens, the quantized store in fewer bytes.
    EXPECT_EQ(quantized->cache().stream_length(TeacherForcedSequence::kSeq, 0, 0),
              f32->cache().stream_length(TeacherForcedSequence::kSeq, 0, 0));
    EXPECT_LT(quantized->held_bytes_fraction(), f32->held_bytes_fraction());
  }
  return static_cast<double>(agree) / static_cast<double>(steps);
}

// SnapKV over KIVI-4: the prompt is scored at full precision and compressed before anything is quantized, then
// decode reads the kept tokens quantized; its next tokens mostly are fp32 SnapKV's. PyramidKV, AdaKV and ChunkKV
// run over KIVI-2 through the engine; the pool is whole after.
TEST(KvStoreEngineTest, SnapKvOverKiviStaysCloseToSnapKvOverTheExplicitCache) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts(4);
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i] = random_prompt(rng, 60 + 9 * static_cast<int>(i));
  const nlohmann::json snapkv = {{"budget", 40}, {"window", 8}};  // kept prompts of 40 tokens: one key block flushed
  const double agreement = decode_agreement(*bundle.model, "snapkv", snapkv, KvStoreKind::kKivi4, prompts, 24);
  RecordProperty("snapkv_kivi4_decode_agreement", std::to_string(agreement));
  // The same measure for KIVI-4 under vanilla, whose decode reads every prompt token quantized.
  const double vanilla = decode_agreement(*bundle.model, "vanilla", nullptr, KvStoreKind::kKivi4, prompts, 24);
  RecordProperty("vanilla_kivi4_decode_agreement", std::to_string(vanilla));
  // 75 of 96 (vanilla over KIVI-4: see the recorded figure), a sharp-attention model.
  EXPECT_GE(agreement, 0.75) << "SnapKV over KIVI-4 picks another next token than fp32 SnapKV too often";
  const Generated kivi4 = generate(bundle, store_config("kivi4", "snapkv", snapkv), prompts, 24);
  EXPECT_EQ(kivi4.stats.num_kv_pages_used, 0);
  for (const char* method : {"pyramidkv", "adakv", "chunkkv"}) {
    const Generated kivi2 = generate(bundle, store_config("kivi2", method, snapkv), prompts, 12);
    for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(kivi2.tokens[r].size(), 12u) << method << " " << r;
    EXPECT_EQ(kivi2.stats.num_kv_pages_used, 0) << method;
  }
}

// SnapKV over KIVI-2 under memory pressure: concurrent requests whose held prompts do not all fit take turns
// through preemption, one is aborted mid-flight, the rest finish, and every page comes back.
TEST(KvStoreEngineTest, SnapKvOverKiviGivesEveryPageBackAfterPreemptionAndAbort) {
  const ModelBundle bundle = tiny_bundle();
  EngineConfig config = store_config("kivi2", "snapkv", {{"budget", 40}, {"window", 8}});
  // Room for two of the prompts below held at full precision, while six arrive at once.
  const ModelConfig& mc = bundle.model->config();
  const KvLayout layout =
      make_kv_layout(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.page_size, Device::kCpu, KvStoreKind::kKivi2,
                     config.kivi_group_size, config.kivi_residual, config.max_num_batched_tokens);
  config.kv_cache_memory =
      2 * KiviCacheManager::held_prompt_pages(layout, 90) * static_cast<int64_t>(layout.page_bytes());
  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  std::mt19937 rng(14);
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < 6; ++i) {
    auto stream = (*engine)->submit({"r" + std::to_string(i), random_prompt(rng, 70 + 4 * i), test::greedy(24)});
    ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
    streams.push_back(*stream);
  }
  (*engine)->abort("r2");
  for (size_t i = 0; i < streams.size(); ++i) {
    const size_t num_tokens = test::collect(*streams[i]).tokens.size();
    if (i != 2) EXPECT_EQ(num_tokens, 24u) << i;
  }
  (*engine)->shutdown(/*drain=*/true);
  const EngineStats stats = (*engine)->stats();
  RecordProperty("snapkv_kivi2_preemptions", std::to_string(stats.preemptions_total));
  EXPECT_GT(stats.preemptions_total, 0u);
  EXPECT_EQ(stats.requests_aborted_total, 1u);
  EXPECT_EQ(stats.num_kv_pages_used, 0);
}

// StreamingLLM and H2O over KIVI: with a budget past every sequence no group ever goes, so their tokens are KIVI's
// alone, exactly; with a small one (whole groups dropped as decode runs) every request runs to its end and the pool is
// whole after.
TEST(KvStoreEngineTest, GroupEvictionOverKiviIsKiviUntilItsBudgetIsReached) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts(4);
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i] = random_prompt(rng, 60 + 9 * static_cast<int>(i));
  for (const char* store : {"kivi2", "kivi4"}) {
    const Generated kivi = generate(bundle, store_config(store), prompts, 40);
    for (const char* method : {"streamingllm", "h2o"}) {
      const Generated unbounded = generate(bundle, store_config(store, method, {{"budget", 1000}}), prompts, 40);
      EXPECT_EQ(unbounded.tokens, kivi.tokens) << method << " over " << store;
      const Generated bounded = generate(bundle, store_config(store, method, {{"budget", 40}}), prompts, 40);
      for (size_t r = 0; r < prompts.size(); ++r)
        EXPECT_EQ(bounded.tokens[r].size(), 40u) << method << " over " << store << " " << r;
      EXPECT_NE(bounded.tokens, kivi.tokens) << method << " over " << store << ": dropping groups changed nothing";
      EXPECT_EQ(bounded.stats.num_kv_pages_used, 0) << method << " over " << store;
    }
  }
}

// Quest over FP8 and KIVI-2 pages (CPU; a KIVI page is a group of 32 tokens here): with a budget past every sequence
// it reads every page, so its tokens are the store's alone, exactly; with a small one it reads fewer keys than the
// store's dense attention, every request runs to its end, and the pool is whole after.
TEST(KvStoreEngineTest, QuestOverQuantizedStoresIsTheStoreUntilItsBudgetBinds) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(13);
  std::vector<std::vector<int32_t>> prompts(4);
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i] = random_prompt(rng, 60 + 9 * static_cast<int>(i));
  for (const char* store : {"fp8", "kivi2"}) {
    const Generated dense = generate(bundle, store_config(store), prompts, 40);
    const Generated unbounded =
        generate(bundle, store_config(store, "quest", {{"token_budget", 4096}, {"dense_layers", 0}}), prompts, 40);
    EXPECT_EQ(unbounded.tokens, dense.tokens) << store;
    const Generated bounded =
        generate(bundle, store_config(store, "quest", {{"token_budget", 64}, {"dense_layers", 0}}), prompts, 40);
    for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(bounded.tokens[r].size(), 40u) << store << " " << r;
    EXPECT_LT(bounded.stats.attended_kv_tokens_total, dense.stats.attended_kv_tokens_total) << store;
    EXPECT_EQ(bounded.stats.num_kv_pages_used, 0) << store;
  }
}

// TurboQuant's presets under vanilla: greedy continuations stay close to the explicit cache (the agreement of each
// is recorded), the pool holds as many more pages as a slot is smaller than an f32 key and value, a prefix reused
// from the radix cache over TurboQuant slots gives the tokens of computing it, and every page comes back.
TEST(KvStoreEngineTest, TurboQuantGreedyGenerationStaysCloseToTheExplicitCache) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts(4);
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i] = random_prompt(rng, 40 + 7 * static_cast<int>(i));
  const Generated f32 = generate(bundle, store_config("auto"), prompts, 24);
  const int32_t head_dim = 16, f32_slot_bytes = 2 * head_dim * 4;
  // Least agreement per preset, a step under what it measures on this model: 75, 65, 54 and 45 of 96 (FP8: 87);
  // the paper's 3.5- and 2.5-bit stores 34 and 15. head_dim 16 is where N(0, 1/d) fits a rotated coordinate worst
  // (the paper's stores code halves of 8 channels, where the QJL estimate's variance, ~D_prod / 8, is largest), and
  // attention here is sharp, so an unbiased but noisy logit flips the argmax often.
  const std::vector<std::pair<std::string, double>> presets = {
      {"turboquant_k8v4", 0.77},    {"turboquant_4bit_nc", 0.67}, {"turboquant_k3v4_nc", 0.55},
      {"turboquant_3bit_nc", 0.46}, {"turboquant_3.5", 0.34},     {"turboquant_2.5", 0.14}};
  for (const auto& [preset, least] : presets) {
    const Generated tq = generate(bundle, store_config(preset), prompts, 24);
    const double agreement = next_token_agreement(bundle, store_config(preset), prompts, f32);
    RecordProperty(preset + "_next_token_agreement", std::to_string(agreement));
    EXPECT_GE(agreement, least) << preset;
    const auto slot_bytes = static_cast<int64_t>(
        turboquant_slot_layout(head_dim, turboquant_format(*parse_kv_cache_dtype(preset))).slot_bytes());
    EXPECT_NEAR(static_cast<double>(tq.stats.num_kv_pages_total) / static_cast<double>(f32.stats.num_kv_pages_total),
                static_cast<double>(f32_slot_bytes) / static_cast<double>(slot_bytes), 0.01)
        << preset;
    EXPECT_EQ(tq.stats.num_kv_pages_used, 0) << preset;
  }
}

TEST(KvStoreEngineTest, TurboQuantRadixPrefixReuseGivesTheTokensOfRecomputing) {
  expect_radix_reuse_gives_the_tokens_of_recomputing("turboquant_k3v4_nc");
  // The paper's store: the outlier split the first request fixed decodes the shared pages for the second.
  expect_radix_reuse_gives_the_tokens_of_recomputing("turboquant_2.5");
}

// Eviction over TurboQuant slots: with budgets past every sequence StreamingLLM, SnapKV and H2O keep everything, so
// their tokens are the store's under vanilla, exactly; with small ones they slide (StreamingLLM) or score the slots'
// keys as attention reads them (SnapKV at the prompt's end, H2O every step), move whole slots, return pages, finish
// every request and leave the pool whole.
TEST(KvStoreEngineTest, EvictionMethodsRunOverTurboQuantSlots) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts(4);
  for (size_t i = 0; i < prompts.size(); ++i) prompts[i] = random_prompt(rng, 60 + 9 * static_cast<int>(i));
  struct Budgets {
    std::string method;
    nlohmann::json unbounded, bounded;
  };
  const std::vector<Budgets> methods = {{"streamingllm", {{"budget", 1000}}, {{"budget", 40}, {"sink_tokens", 4}}},
                                        {"snapkv", {{"budget", 1000}, {"window", 8}}, {{"budget", 40}, {"window", 8}}},
                                        {"h2o", {{"budget", 1000}}, {{"budget", 40}}}};
  for (const char* store : {"turboquant_4bit_nc", "turboquant_3.5"}) {
    const Generated alone = generate(bundle, store_config(store), prompts, 24);
    for (const Budgets& m : methods) {
      // The paper's store under SnapKV alone: its scores read the wide keys; the row moves are the presets'.
      if (std::string_view(store) == "turboquant_3.5" && m.method != "snapkv") continue;
      const Generated unbounded = generate(bundle, store_config(store, m.method, m.unbounded), prompts, 24);
      EXPECT_EQ(unbounded.tokens, alone.tokens) << store << " " << m.method;
      EXPECT_EQ(unbounded.stats.compression_steps_total, 0u) << store << " " << m.method;
      const Generated bounded = generate(bundle, store_config(store, m.method, m.bounded), prompts, 24);
      for (size_t r = 0; r < prompts.size(); ++r) EXPECT_EQ(bounded.tokens[r].size(), 24u) << store << " " << m.method;
      EXPECT_GT(bounded.stats.compression_steps_total, 0u) << store << " " << m.method;
      EXPECT_EQ(bounded.stats.num_kv_pages_used, 0) << store << " " << m.method;
    }
  }
  // Teacher-forced next tokens of SnapKV over the store against fp32 SnapKV's greedy run.
  const nlohmann::json snapkv = {{"budget", 40}, {"window", 8}};
  const Generated f32 = generate(bundle, store_config("auto", "snapkv", snapkv), prompts, 24);
  const double agreement =
      next_token_agreement(bundle, store_config("turboquant_4bit_nc", "snapkv", snapkv), prompts, f32);
  RecordProperty("snapkv_turboquant_4bit_nc_next_token_agreement", std::to_string(agreement));
  // 23 of 96 here: SnapKV ranks the prompt by its noisy 4-bit keys, and on this sharp-attention model another kept
  // set often changes the next token (vanilla over the store, which keeps every token, agrees on 65 of 96).
  EXPECT_GE(agreement, 0.2) << "SnapKV over turboquant_4bit_nc picks another next token than fp32 SnapKV too often";
}

TEST(KvStoreEngineTest, RefusesWhatTheStoreCannotTake) {
  const ModelBundle bundle = tiny_bundle();
  auto omnikv = Engine::create(bundle, store_config("fp8", "omnikv"));
  ASSERT_FALSE(omnikv.is_ok());
  EXPECT_EQ(omnikv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(omnikv.status().message().find("reads explicit K/V pages"), std::string::npos) << omnikv.status().message();
  // R-KV evicts single tokens as decode runs.
  auto rkv = Engine::create(bundle, store_config("kivi2", "rkv"));
  ASSERT_FALSE(rkv.is_ok());
  EXPECT_EQ(rkv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rkv.status().message().find("KIVI"), std::string::npos) << rkv.status().message();
  EngineConfig radix = store_config("kivi4");
  radix.prefix_cache_mode = "radix";
  EXPECT_EQ(Engine::create(bundle, radix).status().code(), StatusCode::kInvalidArgument);
  EngineConfig offloaded = store_config("kivi4");
  offloaded.kv_offloading_size = int64_t{4} << 20;  // the host tier copies explicit pages only
  const auto with_host_tier = Engine::create(bundle, offloaded);
  ASSERT_FALSE(with_host_tier.is_ok());
  EXPECT_EQ(with_host_tier.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(with_host_tier.status().message().find("host tier"), std::string::npos)
      << with_host_tier.status().message();
  EngineConfig ragged = store_config("kivi4");
  ragged.kivi_residual = 40;  // not a multiple of the group
  EXPECT_EQ(Engine::create(bundle, ragged).status().code(), StatusCode::kInvalidArgument);
  auto kvzip = Engine::create(bundle, store_config("turboquant_4bit_nc", "kvzip"));
  ASSERT_FALSE(kvzip.is_ok());
  EXPECT_EQ(kvzip.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kvzip.status().message().find("reads explicit K/V pages"), std::string::npos) << kvzip.status().message();
  auto unknown = Engine::create(bundle, store_config("int3"));
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace se
