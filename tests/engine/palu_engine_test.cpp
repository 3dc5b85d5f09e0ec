// Palu (low-rank KV, the `palu` method) on the tiny model: at full rank its logits are the dense model's within fp32
// rounding on every family it serves (Llama; Qwen2's k/v biases; Qwen3's key norm; Gemma 3's sliding windows and key
// norm), at half rank they are not; the store's streams hold only the latents' bytes; a prefix reused from the radix
// cache gives the tokens of recomputing it; and what it cannot run is refused before it starts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../support/engine_runs.h"
#include "engine/teacher_forcing.h"
#include "sparse/low_rank_kv.h"
#include "sparse/method_registry.h"

namespace se {
namespace {

std::vector<int32_t> random_prompt(std::mt19937& rng, int len) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 96);
  return p;
}

int32_t argmax(const Tensor& logits) {
  const float* p = logits.data<float>();
  return static_cast<int32_t>(std::max_element(p, p + logits.numel()) - p);
}

// The largest |palu - vanilla| over the largest |vanilla| of the logits of a chunked prefill and eight decode steps
// (fed vanilla's greedy tokens, so both see the same sequence).
double worst_logit_error(const Model& model, const nlohmann::json& palu_config) {
  std::mt19937 rng(3);
  const std::vector<int32_t> prompt = random_prompt(rng, 30);
  TeacherForcingOptions options;
  options.page_size = 4;
  options.prefill_chunk = 7;
  options.max_tokens = 40;
  auto dense = TeacherForcedSequence::create(model, options);
  SE_CHECK(dense.is_ok(), "{}", dense.status().to_string());
  options.method = "palu";
  options.config = palu_config;
  options.environment.model = &model;
  auto palu = TeacherForcedSequence::create(model, options);
  SE_CHECK(palu.is_ok(), "{}", palu.status().to_string());
  double worst = 0;
  auto want = (*dense)->prefill(prompt);
  auto got = (*palu)->prefill(prompt);
  for (int step = 0;; ++step) {
    SE_CHECK(want.is_ok() && got.is_ok(), "forward failed");
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < want->numel(); ++i) {
      diff = std::max(diff, double{std::fabs(got->data<float>()[i] - want->data<float>()[i])});
      scale = std::max(scale, double{std::fabs(want->data<float>()[i])});
    }
    worst = std::max(worst, diff / scale);
    if (step == 8) break;
    const int32_t next = argmax(*want);
    want = (*dense)->decode(next);
    got = (*palu)->decode(next);
  }
  return worst;
}

class PaluFamilyTest : public testing::TestWithParam<const char*> {};

TEST_P(PaluFamilyTest, FullRankGivesTheDenseLogitsAndHalfRankDoesNot) {
  const Model model = test::tiny_model(GetParam());
  // Two KV heads of 16 form one group of 32 rows: rank 32 keeps all of W_k and W_v.
  EXPECT_LT(worst_logit_error(model, {{"k_rank", 32}, {"v_rank", 32}}), 1e-4);
  EXPECT_GT(worst_logit_error(model, {{"rank_ratio", 0.5}}), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Families, PaluFamilyTest, testing::Values("llama", "qwen2", "qwen3", "gemma3_text"));

TEST(PaluTest, TheStoreHoldsTheLatentsBytes) {
  const Model model = test::tiny_model();
  MethodEnvironment environment;
  environment.model = &model;
  auto method = create_method("palu", {{"rank_ratio", 0.5}, {"v_rank", 8}}, environment);
  ASSERT_TRUE(method.is_ok()) << method.status().to_string();
  const LowRankKv* low_rank = (*method)->low_rank_kv();
  ASSERT_NE(low_rank, nullptr);
  EXPECT_EQ(low_rank->shape().group_heads, 2);
  EXPECT_EQ(low_rank->shape().k_rank, 16);  // half of the group's 2 x 16 rows
  EXPECT_EQ(low_rank->shape().v_rank, 8);
  const KvLayout dense = make_kv_layout(2, 2, 16, 4, Device::kCpu, KvStoreKind::kExplicit, 0, 0, 0);
  const KvLayout store = low_rank->store_layout(dense);
  EXPECT_EQ(store.num_streams(), 2);  // one group per layer
  // Per layer and token: 16 + 8 latent values against 2 heads x (16 + 16) K/V values.
  EXPECT_EQ(store.num_streams() * store.bytes_per_token(1), 2 * 24 * 4.0);
  EXPECT_EQ(dense.num_streams() * dense.bytes_per_token(1), 2 * 64 * 4.0);
  EXPECT_EQ(store.page_bytes(), size_t{4} * 24 * 4);
}

EngineConfig palu_config(const nlohmann::json& config) {
  EngineConfig c;
  c.sparse_method = "palu";
  c.sparse_config = config;
  c.page_size = 4;
  c.max_num_batched_tokens = 32;  // prompts arrive in several chunks
  c.kv_cache_memory = 8 << 20;
  return c;
}

TEST(PaluTest, RadixPrefixReuseGivesTheTokensOfRecomputing) {
  const ModelBundle bundle = test::tiny_bundle();
  std::mt19937 rng(12);
  const std::vector<int32_t> prompt = random_prompt(rng, 45);
  EngineConfig no_reuse = palu_config({{"rank_ratio", 0.5}});
  no_reuse.enable_prefix_caching = false;
  const test::Generated cached = test::generate(bundle, palu_config({{"rank_ratio", 0.5}}), {prompt, prompt}, 12);
  const test::Generated computed = test::generate(bundle, no_reuse, {prompt, prompt}, 12);
  EXPECT_EQ(cached.num_cached_tokens[1], 44);  // every full page of the prompt
  EXPECT_EQ(computed.num_cached_tokens[1], 0);
  EXPECT_EQ(cached.tokens[1], computed.tokens[1]);
  EXPECT_EQ(cached.tokens[1], cached.tokens[0]);
  EXPECT_EQ(cached.stats.num_kv_pages_used, computed.stats.num_kv_pages_used);
}

TEST(PaluTest, WhatItCannotRunIsRefused) {
  const ModelBundle bundle = test::tiny_bundle();
  EngineConfig fp8 = palu_config(nullptr);
  fp8.kv_cache_dtype = "fp8";
  EXPECT_EQ(Engine::create(bundle, fp8).status().code(), StatusCode::kInvalidArgument);
  EngineConfig chain = palu_config(nullptr);
  chain.prefix_cache_mode = "chain";
  EXPECT_EQ(Engine::create(bundle, chain).status().code(), StatusCode::kInvalidArgument);
  // A rank past the group's rows, a bad key, no model to factor.
  MethodEnvironment environment;
  environment.model = bundle.model.get();
  const Status too_wide = create_method("palu", {{"k_rank", 33}}, environment).status();
  EXPECT_EQ(too_wide.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_wide.message().find("rank 33 is outside [1, 32]"), std::string::npos) << too_wide.message();
  EXPECT_EQ(create_method("palu", {{"rank", 4}}, environment).status().code(), StatusCode::kInvalidArgument);
  auto unbound = create_method("palu", nullptr);
  ASSERT_TRUE(unbound.is_ok());  // config-only: what `sparse-engine methods` and flag checks create
  EXPECT_EQ((*unbound)->low_rank_kv(), nullptr);
  CacheSpec spec;
  spec.layout = make_kv_layout(2, 1, 32, 4, Device::kCpu, KvStoreKind::kLowRankLatent, 0, 0, 0);
  spec.num_pages = 8;
  EXPECT_EQ((*unbound)->create_cache(spec).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace se
