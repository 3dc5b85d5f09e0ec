#include "engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "../support/engine_runs.h"
#include "../support/tiny_engine.h"
#include "../support/tiny_model.h"
#include "base/check.h"
#include "engine/sequence_generator.h"

namespace se {
namespace {

using test::collect;
using test::Generation;
using test::greedy;
using test::tiny_bundle;

std::vector<int32_t> random_prompt(std::mt19937& rng, int len) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 96);
  return p;
}

// Concurrent greedy requests through the engine (batched, chunked, possibly preempted) give exactly the tokens
// of one-at-a-time generation on the contiguous reference path.
void expect_engine_matches_reference(const EngineConfig& config, int num_requests, bool expect_preemption) {
  ModelBundle bundle = tiny_bundle();
  SequenceGenerator reference(*bundle.model, nullptr);
  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<OutputStream>> streams;
  for (int i = 0; i < num_requests; ++i) {
    prompts.push_back(random_prompt(rng, 3 + static_cast<int>(rng() % 40)));
    auto stream = (*engine)->submit({"r" + std::to_string(i), prompts.back(), greedy(12)});
    ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
    streams.push_back(*stream);
  }
  for (int i = 0; i < num_requests; ++i) {
    Generation got = collect(*streams[static_cast<size_t>(i)]);
    auto want = reference.generate(prompts[static_cast<size_t>(i)], greedy(12));
    ASSERT_TRUE(want.is_ok());
    EXPECT_EQ(got.tokens, want->output_ids) << "request " << i;
    EXPECT_EQ(got.last.finish_reason, FinishReason::kLength);
    EXPECT_EQ(got.last.num_output_tokens, 12);
  }
  (*engine)->shutdown(/*drain=*/true);
  EngineStats stats = (*engine)->stats();
  EXPECT_EQ(stats.num_kv_pages_used, 0);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
  EXPECT_EQ(stats.requests_finished_total, static_cast<uint64_t>(num_requests));
  EXPECT_EQ(stats.preemptions_total > 0, expect_preemption) << stats.preemptions_total << " preemptions";
}

TEST(ForwardWorkspaceTest, BytesForCountsEveryBufferReserveAllocates) {
  const Model model = test::tiny_model();
  ForwardWorkspace w = model.make_workspace();
  const int32_t t = 7, r = 3;
  w.reserve(t, r);
  int64_t viewed = 0;
  for (const TensorView& v : {w.token_ids(t), w.positions(t), w.logit_rows(r), w.hidden(t), w.normed(t), w.q(t),
                              w.k(t), w.v(t), w.attn(t), w.proj(t), w.gate_up(t), w.act(t), w.last(r),
                              w.last_normed(r), w.logits(r).view()})
    viewed += static_cast<int64_t>(v.nbytes());
  if (w.qkv(t).data != w.gate_up(t).data) viewed += static_cast<int64_t>(w.qkv(t).nbytes());
  EXPECT_EQ(ForwardWorkspace::bytes_for(model.config(), w.matmul_dtype(), t, r), viewed);
}

TEST(EngineTest, ConcurrentGreedyRequestsMatchSequentialReference) {
  EngineConfig config;
  config.max_num_batched_tokens = 32;  // forces chunked prefill and mixed steps
  config.page_size = 4;
  config.kv_cache_memory = 64 << 20;
  expect_engine_matches_reference(config, 8, /*expect_preemption=*/false);
}

TEST(EngineTest, PreemptionUnderMemoryPressureKeepsResultsExact) {
  EngineConfig config;
  config.max_num_batched_tokens = 64;
  config.page_size = 4;
  // Pages of 2 x 4 tokens x 16 floats = 512 bytes; 80 pages over 4 streams hold 80 tokens in all, while one
  // request needs up to 54: the six requests take turns through preemption.
  config.kv_cache_memory = 80 * 512;
  expect_engine_matches_reference(config, 6, /*expect_preemption=*/true);
}

// The same pressure under peak admission: a request starts only when it fits beside the running ones at their peaks
// (prompt + 12 tokens each), so they take turns without a preemption and give the same tokens.
TEST(EngineTest, PeakAdmissionRunsThePressureWithoutPreemption) {
  EngineConfig config;
  config.max_num_batched_tokens = 64;
  config.page_size = 4;
  config.kv_cache_memory = 80 * 512;
  config.admission = Admission::kPeak;
  expect_engine_matches_reference(config, 6, /*expect_preemption=*/false);
}

// Kara keeps each running sequence's recent queries beside the pool, out of the same KV budget. On the tiny model
// (pages of 2 x 4 tokens x 16 floats = 512 bytes over 4 streams; rings of 2 layers x 10 rows x 64 bf16 values =
// 2,560 bytes a sequence) a budget of one 192-token request's 192 pages plus three rings runs 3 sequences at once of
// the 8 asked, and every request completes with the tokens an ample budget gives it; a budget short of one ring beside
// that request is refused at startup.
TEST(EngineTest, ABudgetHoldingFewerSequencesStateRunsFewerAndEveryRequestCompletes) {
  ModelBundle bundle = tiny_bundle();
  EngineConfig config;
  config.sparse_method = "kara";
  config.sparse_config = {{"window", 8}, {"buffer", 2}, {"candidates", 2}, {"budget", 4}, {"period", 4}};
  config.page_size = 4;
  config.max_model_len = 192;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 64;
  constexpr int64_t kRequestBytes = 192 * 512, kRingBytes = 2 * 10 * 64 * 2;
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts(8);
  for (std::vector<int32_t>& prompt : prompts) prompt = random_prompt(rng, 20 + static_cast<int>(rng() % 20));
  // Every request at once; each one's tokens, and the engine's concurrency and stats once drained.
  auto run = [&](int64_t kv_cache_memory, int want_max_num_seqs) {
    EngineConfig c = config;
    c.kv_cache_memory = kv_cache_memory;
    auto engine = Engine::create(bundle, c);
    EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
    std::vector<std::vector<int32_t>> tokens;
    if (!engine.is_ok()) return tokens;
    EXPECT_EQ((*engine)->config().max_num_seqs, want_max_num_seqs);
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto stream = (*engine)->submit({"r" + std::to_string(i), prompts[i], greedy(16)});
      EXPECT_TRUE(stream.is_ok()) << stream.status().to_string();
      if (stream.is_ok()) streams.push_back(*stream);
    }
    for (const auto& stream : streams) {
      Generation got = collect(*stream);
      EXPECT_EQ(got.last.finish_reason, FinishReason::kLength);
      tokens.push_back(std::move(got.tokens));
    }
    (*engine)->shutdown(/*drain=*/true);
    const EngineStats stats = (*engine)->stats();
    EXPECT_EQ(stats.requests_finished_total, prompts.size());
    EXPECT_GT(stats.compression_steps_total, 0u);
    EXPECT_EQ(stats.num_kv_pages_used, 0);
    return tokens;
  };
  const std::vector<std::vector<int32_t>> ample = run(int64_t{64} << 20, 8);
  const std::vector<std::vector<int32_t>> capped = run(kRequestBytes + 3 * kRingBytes + 100, 3);
  ASSERT_EQ(capped.size(), prompts.size());
  EXPECT_EQ(capped, ample);

  config.kv_cache_memory = kRequestBytes + kRingBytes - 1;
  auto refused = Engine::create(bundle, config);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("kara keeps per running sequence"), std::string::npos)
      << refused.status().message();
}

// A prompt's radix blocks, evicted by later requests, are kept on the host tier and serve its repeat as a prefix
// hit that generates exactly the reference tokens; without the tier the repeat finds nothing cached.
TEST(EngineTest, RadixBlocksEvictedToTheHostTierServeALaterPrefixHit) {
  ModelBundle bundle = tiny_bundle();
  SequenceGenerator reference(*bundle.model, nullptr);
  std::mt19937 rng(8);
  const std::vector<int32_t> prompt = random_prompt(rng, 40);
  std::vector<std::vector<int32_t>> others(3);
  for (std::vector<int32_t>& other : others) other = random_prompt(rng, 50);
  auto want = reference.generate(prompt, greedy(12));
  ASSERT_TRUE(want.is_ok());
  for (const int64_t num_host_pages : {200, 0}) {
    EngineConfig config;
    config.max_num_batched_tokens = 64;
    config.page_size = 4;
    config.kv_cache_memory = 120 * 512;  // pages of 2 x 4 tokens x 16 floats; two cached requests fill them
    config.kv_offloading_size = num_host_pages * 512;
    auto engine = Engine::create(bundle, config);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    const auto run = [&](const std::string& id, const std::vector<int32_t>& tokens) {
      auto stream = (*engine)->submit({id, tokens, greedy(12)});
      EXPECT_TRUE(stream.is_ok()) << stream.status().to_string();
      return stream.is_ok() ? collect(**stream) : Generation{};
    };
    EXPECT_EQ(run("first", prompt).tokens, want->output_ids);
    for (size_t i = 0; i < others.size(); ++i) run("other" + std::to_string(i), others[i]);
    const Generation again = run("again", prompt);
    EXPECT_EQ(again.tokens, want->output_ids);
    // Every whole block of the prompt but the one holding its last token, which is always computed.
    EXPECT_EQ(again.last.num_cached_tokens, num_host_pages > 0 ? 36 : 0) << num_host_pages << " host pages";
    (*engine)->shutdown(/*drain=*/true);
    const EngineStats stats = (*engine)->stats();
    EXPECT_EQ(stats.num_kv_host_pages_total, num_host_pages);
    EXPECT_EQ(stats.num_kv_pages_used, 0);
  }
}

// Quest keeps key bounds per device page. Radix blocks that come back from the host tier land under new page ids,
// whose bounds it recomputes from their keys, so the repeat decodes exactly as the run that recomputed its prompt
// (reading 2 of the prompt's 10 pages, a page ranked by another page's stale bounds would change the logprobs).
TEST(EngineTest, QuestRanksPagesBroughtBackFromTheHostTierByTheirOwnKeys) {
  ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(8);
  const std::vector<int32_t> prompt = random_prompt(rng, 40);
  std::vector<std::vector<int32_t>> others(3);
  for (std::vector<int32_t>& other : others) other = random_prompt(rng, 50);
  std::vector<std::vector<float>> logprobs;  // of the repeat: with the host tier, without, dense
  for (const auto& [method, num_host_pages] :
       std::vector<std::pair<std::string, int64_t>>{{"quest", 200}, {"quest", 0}, {"vanilla", 0}}) {
    EngineConfig config;
    config.max_num_batched_tokens = 64;
    config.page_size = 4;
    config.kv_cache_memory = 120 * 512;  // pages of 2 x 4 tokens x 16 floats; two cached requests fill them
    config.kv_offloading_size = num_host_pages * 512;
    config.sparse_method = method;
    if (method == "quest") config.sparse_config = {{"token_budget", 8}, {"dense_layers", 0}};
    auto engine = Engine::create(bundle, config);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    const auto run = [&](const std::string& id, const std::vector<int32_t>& tokens) {
      SamplingParams params = greedy(12);
      params.logprobs = 0;
      auto stream = (*engine)->submit({id, tokens, params});
      EXPECT_TRUE(stream.is_ok()) << stream.status().to_string();
      return stream.is_ok() ? collect(**stream) : Generation{};
    };
    run("first", prompt);
    for (size_t i = 0; i < others.size(); ++i) run("other" + std::to_string(i), others[i]);
    const Generation again = run("again", prompt);
    EXPECT_EQ(again.last.num_cached_tokens, num_host_pages > 0 ? 36 : 0) << method << ", " << num_host_pages;
    logprobs.push_back(again.logprobs);
    (*engine)->shutdown(/*drain=*/true);
    EXPECT_EQ((*engine)->stats().num_kv_pages_used, 0);
  }
  ASSERT_EQ(logprobs[0].size(), 12u);
  ASSERT_EQ(logprobs[1].size(), 12u);
  for (size_t t = 0; t < logprobs[0].size(); ++t)
    EXPECT_NEAR(logprobs[0][t], logprobs[1][t], 1e-4f * std::max(1.0f, std::abs(logprobs[1][t]))) << "token " << t;
  EXPECT_NE(logprobs[1], logprobs[2]) << "Quest's selection must change what the repeat reads";
}

TEST(EngineTest, RejectsBadRequestsAndKeepsServing) {
  ModelBundle bundle = tiny_bundle();
  EngineConfig config;
  config.max_model_len = 100;
  config.page_size = 4;
  config.kv_cache_memory = 80 * 512;  // 80 pages: 80 tokens per (layer, KV head) in all
  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok());
  EXPECT_EQ((*engine)->submit({"empty", {}, greedy(4)}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->submit({"oov", {1, 500}, greedy(4)}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->submit({"long", std::vector<int32_t>(95, 1), greedy(10)}).status().code(),
            StatusCode::kOutOfRange);
  SamplingParams bad = greedy(4);
  bad.top_p = 2.0f;
  EXPECT_EQ((*engine)->submit({"bad", {1, 2}, bad}).status().code(), StatusCode::kInvalidArgument);
  // 50 + 40 tokens fit the context but never the pool (80 tokens per stream).
  EXPECT_EQ((*engine)->submit({"huge", std::vector<int32_t>(50, 1), greedy(40)}).status().code(),
            StatusCode::kResourceExhausted);
  auto ok = (*engine)->submit({"fine", {1, 2, 3}, greedy(5)});
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ((*engine)->submit({"fine", {1, 2, 3}, greedy(5)}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(collect(**ok).tokens.size(), 5u);
}

// A batch is queued whole: the first step prefills every prompt (here one step each for the prompts, then one per
// new token), and a bad request anywhere in it queues nothing.
TEST(EngineTest, SubmitBatchQueuesAllOrNothing) {
  ModelBundle bundle = tiny_bundle();
  EngineConfig config;
  config.page_size = 4;
  config.kv_cache_memory = 16 << 20;
  config.max_num_seqs = 4;
  config.max_num_batched_tokens = 256;
  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok());
  std::mt19937 rng(9);
  auto batch_of = [&](std::vector<std::string> ids) {
    std::vector<GenerationRequest> batch;
    for (std::string& id : ids) batch.push_back({std::move(id), random_prompt(rng, 20), greedy(6)});
    return batch;
  };
  std::vector<GenerationRequest> bad = batch_of({"a", "b", "c"});
  bad[1].prompt_ids.push_back(500);
  EXPECT_EQ((*engine)->submit_batch(std::move(bad)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->submit_batch(batch_of({"a", "a"})).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->stats().num_waiting + (*engine)->stats().num_running, 0);

  auto streams = (*engine)->submit_batch(batch_of({"a", "b", "c", "d"}));
  ASSERT_TRUE(streams.is_ok()) << streams.status().to_string();
  for (const auto& stream : *streams) EXPECT_EQ(collect(*stream).tokens.size(), 6u);
  (*engine)->shutdown(/*drain=*/true);
  EXPECT_EQ((*engine)->stats().steps_total, 6u);  // one step prefills all four prompts, five more decode them
}

TEST(EngineTest, AbortEndsTheStreamAndFreesPages) {
  ModelBundle bundle = tiny_bundle();
  EngineConfig config;
  config.page_size = 4;
  config.kv_cache_memory = 64 << 20;
  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok());
  auto stream = (*engine)->submit({"long", {1, 2, 3, 4}, greedy(1500)});
  ASSERT_TRUE(stream.is_ok());
  ASSERT_TRUE((*stream)->next(std::chrono::milliseconds(60000)).has_value());  // it is running
  (*engine)->abort("long");
  Generation c = collect(**stream);
  EXPECT_EQ(c.last.finish_reason, FinishReason::kAbort);
  EXPECT_LT(c.tokens.size(), 1500u);
  for (int i = 0; i < 100 && (*engine)->stats().num_kv_pages_used != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ((*engine)->stats().num_kv_pages_used, 0);
  EXPECT_EQ((*engine)->stats().requests_aborted_total, 1u);
}

// The counters `bench decode` times and sizes its roofline with: one step per forward, and per step, layer and KV
// head the tokens the sequence's last query row reads (dense: the whole stream).
// One 10-token prompt and 5 greedy tokens through an engine over 4-token pages; the stats once it drained.
EngineStats stats_after_one_request(const ModelBundle& bundle, EngineConfig config) {
  config.page_size = 4;
  config.kv_cache_memory = 16 << 20;
  auto engine = Engine::create(bundle, config);
  SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
  std::mt19937 rng(5);
  auto stream = (*engine)->submit({"r", random_prompt(rng, 10), greedy(5)});
  SE_CHECK(stream.is_ok(), "{}", stream.status().to_string());
  EXPECT_EQ(collect(**stream).tokens.size(), 5u);
  (*engine)->shutdown(/*drain=*/true);
  return (*engine)->stats();
}

TEST(EngineTest, StatsCountStepsAndTheKvTokensAttentionReads) {
  ModelBundle bundle = tiny_bundle();
  const EngineStats stats = stats_after_one_request(bundle, EngineConfig{});
  EXPECT_EQ(stats.steps_total, 5u);  // the prompt in one step, then 4 decode steps
  const ModelConfig& c = bundle.model->config();
  // The prefill's last row sees 10 tokens, the decode steps 11 .. 14.
  EXPECT_EQ(stats.attended_kv_tokens_total, static_cast<uint64_t>(c.num_layers * c.num_kv_heads * (10 + 11 + 12 + 13 + 14)));
  EXPECT_EQ(stats.num_prefilling, 0);
}

// A mixture of experts reads, per step and MoE layer, the experts its rows chose: a decoding row exactly
// num_experts_per_tok of them, the 10-token prefill between that and all of them. A dense model reads none.
TEST(EngineTest, StatsCountTheExpertWeightsAStepReads) {
  ModelBundle moe;
  moe.name = "tiny-moe";
  moe.source_format = "dummy";
  moe.model = std::make_unique<Model>(test::tiny_model("qwen3_moe"));
  const EngineStats stats = stats_after_one_request(moe, EngineConfig{});
  const ModelConfig& c = moe.model->config();
  const LayerWeights& w = moe.model->weights().layers[0];
  const auto expert_bytes =
      static_cast<uint64_t>((w.experts_gate_up.nbytes() + w.experts_down.nbytes()) / c.num_experts);
  const auto moe_layers = static_cast<uint64_t>(c.num_layers), k = static_cast<uint64_t>(c.num_experts_per_tok);
  ASSERT_EQ(stats.steps_total, 5u);
  ASSERT_EQ(stats.expert_weight_bytes_total % expert_bytes, 0u);
  const uint64_t decode_experts = 4 * moe_layers * k;
  const uint64_t prefill_experts = stats.expert_weight_bytes_total / expert_bytes - decode_experts;
  EXPECT_GE(prefill_experts, moe_layers * k);
  EXPECT_LE(prefill_experts, moe_layers * static_cast<uint64_t>(c.num_experts));
  EXPECT_EQ(stats_after_one_request(tiny_bundle(), EngineConfig{}).expert_weight_bytes_total, 0u);
}

// Quest hands attention lists produced where the pool lives, which the host does not read: the count comes from
// the method. A 2-page budget over 4-token pages reads the best page but the last (4 tokens) plus the last page.
TEST(EngineTest, StatsCountTheKvTokensQuestsPageListsRead) {
  ModelBundle bundle = tiny_bundle();
  EngineConfig config;
  config.sparse_method = "quest";
  config.sparse_config = {{"token_budget", 8}, {"dense_layers", 0}};
  const EngineStats stats = stats_after_one_request(bundle, config);
  const ModelConfig& c = bundle.model->config();
  // Prefill reads all 10; decode over 11, 12, 13 and 14 stored tokens reads 4 + 3, 4 + 4, 4 + 1 and 4 + 2.
  EXPECT_EQ(stats.attended_kv_tokens_total,
            static_cast<uint64_t>(c.num_layers * c.num_kv_heads * (10 + 7 + 8 + 5 + 6)));
}

// Quest ranks every sequence of a mixed step in one op while only the decode ones read their lists: a prompt
// longer than the decode sequences' ranking room (over 256 pages) prefills in chunks beside a decoding request,
// and both produce what each produces alone.
TEST(EngineTest, QuestDecodesBesideALongChunkedPrefill) {
  ModelBundle bundle = tiny_bundle();
  EngineConfig config;
  config.sparse_method = "quest";
  config.sparse_config = {{"token_budget", 8}, {"dense_layers", 0}};
  config.max_num_batched_tokens = 64;
  config.page_size = 4;
  config.kv_cache_memory = 64 << 20;
  std::mt19937 rng(11);
  const std::vector<int32_t> short_prompt = random_prompt(rng, 6);
  const std::vector<int32_t> long_prompt = random_prompt(rng, 1200);
  // Each request: its prompt and how many tokens it generates.
  using Requests = std::vector<std::pair<std::vector<int32_t>, int>>;
  const auto run = [&](const Requests& requests) {
    auto engine = Engine::create(bundle, config);
    SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
    std::vector<std::shared_ptr<OutputStream>> streams;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto stream = (*engine)->submit({"r" + std::to_string(i), requests[i].first, greedy(requests[i].second)});
      SE_CHECK(stream.is_ok(), "{}", stream.status().to_string());
      streams.push_back(*stream);
    }
    std::vector<std::vector<int32_t>> tokens;
    for (auto& stream : streams) tokens.push_back(collect(*stream).tokens);
    (*engine)->shutdown(/*drain=*/true);
    return tokens;
  };
  const auto together = run({{short_prompt, 40}, {long_prompt, 6}});
  ASSERT_EQ(together.size(), 2u);
  EXPECT_EQ(together[0].size(), 40u);
  EXPECT_EQ(together[1].size(), 6u);
  EXPECT_EQ(together[0], run({{short_prompt, 40}})[0]);
  EXPECT_EQ(together[1], run({{long_prompt, 6}})[0]);
}

}  // namespace
}  // namespace se
