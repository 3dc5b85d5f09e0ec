// Chain Cache through the Engine on the tiny model. Resume correctness: for every eviction method, turn 2
// resumed from the chain produces exactly the tokens and log-probabilities (top 8 per step) of one sequence that
// runs turn 1 and then turn 2's new tokens through the same method without ever leaving the cache (a scheduler,
// memory oracle and model runner driven directly, as the engine drives them). Lifecycle: create -> resume ->
// prefix mismatch (409) -> busy (409) -> reclaim under page pressure -> gone (410), fingerprint and mode errors,
// and page accounting after every path.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include "../support/prune_wait.h"
#include "../support/tiny_model.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/prune_scoring.h"
#include "engine/scheduler.h"
#include "sparse/kivi_cache_manager.h"
#include "sparse/method_registry.h"
#include "sparse/retained_sequence.h"

namespace se {
namespace {

constexpr int kPageSize = 4;
constexpr int kMaxBatchedTokens = 32;  // prompts arrive in several chunks in both paths
constexpr int kNumTopLogprobs = 8;

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = kNumTopLogprobs;
  return p;
}

// What a turn produced, step by step: the sampled token, its log-probability and the top alternatives.
struct TurnOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  RequestOutput last;

  void add(int32_t token, float logprob, std::vector<TokenLogprob> alternatives) {
    tokens.push_back(token);
    logprobs.push_back(logprob);
    top.push_back(std::move(alternatives));
  }
};

TurnOutput collect(OutputStream& stream) {
  TurnOutput turn;
  while (true) {
    auto out = stream.next(std::chrono::milliseconds(120000));
    EXPECT_TRUE(out.has_value()) << "stream stalled";
    if (!out) return turn;
    for (const TokenOutput& t : out->tokens) turn.add(t.token_id, t.logprob, t.top);
    if (out->finished) {
      turn.last = *out;
      return turn;
    }
  }
}

void expect_same_turn(const TurnOutput& got, const TurnOutput& want) {
  ASSERT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs, want.logprobs);  // exact: the same forward over the same state
  for (size_t i = 0; i < got.top.size(); ++i) {
    ASSERT_EQ(got.top[i].size(), want.top[i].size());
    for (size_t j = 0; j < got.top[i].size(); ++j) {
      EXPECT_EQ(got.top[i][j].token_id, want.top[i][j].token_id) << "step " << i;
      EXPECT_EQ(got.top[i][j].logprob, want.top[i][j].logprob) << "step " << i;
    }
  }
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % 96);
  return t;
}

ModelBundle tiny_bundle(const std::string& model_type = "llama") {
  ModelBundle bundle;
  bundle.name = "tiny";
  bundle.path = "tiny";
  bundle.source_format = "dummy";
  bundle.model = std::make_unique<Model>(test::tiny_model(model_type));
  return bundle;
}

EngineConfig chain_config(const std::string& method, const nlohmann::json& method_config, int64_t num_pages) {
  EngineConfig config;
  config.sparse_method = method;
  config.sparse_config = method_config;
  config.page_size = kPageSize;
  config.max_num_batched_tokens = kMaxBatchedTokens;
  config.kv_cache_memory = num_pages * 2 * kPageSize * 16 * 4;  // pages of [2][page_size][head_dim 16] fp32
  return config;
}

// A turn after the first: its new tokens (after the previous turn's output) and how many tokens it generates.
struct LaterTurn {
  std::vector<int32_t> suffix;
  int num_tokens = 0;
};

// One sequence through a conversation without leaving the cache: turn 1 generates `num_turn1` tokens, then its
// request takes on each later turn's new tokens as more prompt and generates that turn's tokens; returns what each
// later turn produced. `between_turns` (if set) acts on the sequence (its slot) after turn 1, as a prune of its
// chain would.
using BetweenTurns = std::function<void(SparseController& controller, int32_t seq)>;
std::vector<TurnOutput> replay_turns(const ModelBundle& bundle, const EngineConfig& config,
                                     const std::vector<int32_t>& prompt1, int num_turn1,
                                     const std::vector<LaterTurn>& later, const BetweenTurns& between_turns = {}) {
  const ModelConfig& c = bundle.model->config();
  auto method = create_method(config.sparse_method, config.sparse_config);
  SE_CHECK(method.is_ok(), "{}", method.status().to_string());
  const KvStoreKind store = parse_kv_cache_dtype(config.kv_cache_dtype).value();
  const KvLayout layout = make_kv_layout(c.num_layers, c.num_kv_heads, c.head_dim, kPageSize, Device::kCpu, store,
                                         config.kivi_group_size, config.kivi_residual, kMaxBatchedTokens);
  auto cache = (*method)->create_cache(CacheSpec{layout, 4096, cpu_allocator(), false});
  SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
  SparseController controller(**method, **cache);
  MemoryOracle oracle(controller, nullptr);
  Scheduler scheduler(SchedulerConfig{1, kMaxBatchedTokens}, oracle);
  ModelRunner runner(*bundle.model, controller, bundle.model->make_workspace());

  int num_generated = num_turn1;
  for (const LaterTurn& turn : later) num_generated += turn.num_tokens;
  Request request("replay", prompt1, greedy(num_generated));
  scheduler.add(&request);
  std::vector<TurnOutput> outputs(later.size());
  auto run_until = [&](int num_output_tokens, TurnOutput* record) {
    while (request.num_output_tokens() < num_output_tokens) {
      StepPlan plan = scheduler.schedule();
      SE_CHECK(!plan.empty() && plan.preempted.empty(), "the replay must run without preemption");
      std::vector<SampledToken> sampled = runner.execute(plan);
      for (const ScheduledRequest& s : plan.scheduled) {
        s.request->num_computed_tokens += s.num_tokens;
        oracle.commit(*s.request);
      }
      for (const SampledToken& t : sampled) {
        request.token_ids.push_back(t.sample.token_id);
        if (record != nullptr) record->add(t.sample.token_id, t.sample.logprob, t.sample.top);
      }
    }
  };
  run_until(num_turn1, nullptr);
  if (between_turns) between_turns(controller, request.seq);
  for (size_t t = 0; t < later.size(); ++t) {
    // The turn's new tokens become prompt: prefilled on top of what the turns before left, as a resumed chain
    // prefills them.
    request.token_ids.insert(request.token_ids.end(), later[t].suffix.begin(), later[t].suffix.end());
    request.num_prompt_tokens = request.num_tokens();
    request.num_prefill_tokens = request.num_tokens();
    run_until(later[t].num_tokens, &outputs[t]);
  }
  oracle.release(request);
  SE_CHECK((*cache)->check_integrity().is_ok(), "replay cache integrity");
  SE_CHECK((*cache)->num_free_pages() == (*cache)->num_total_pages(), "the replay leaked pages");
  return outputs;
}

TurnOutput replay_two_turns(const ModelBundle& bundle, const EngineConfig& config, const std::vector<int32_t>& prompt1,
                            int num_turn1, const std::vector<int32_t>& suffix, int num_turn2,
                            const BetweenTurns& between_turns = {}) {
  return replay_turns(bundle, config, prompt1, num_turn1, {{suffix, num_turn2}}, between_turns).front();
}

struct MethodCase {
  const char* name;
  nlohmann::json config;
  const char* model_type = "llama";  // gemma3_text: every other layer a sliding window of 8
  int turn1 = 6;                     // tokens turn 1 generates (decode-time methods compress within it)
  const char* kv_cache_dtype = "auto";
  const char* label = nullptr;  // the test's name when the method and dtype do not tell the cases apart
};

// Turn 2 of chain "c": turn 1's prompt and output, then `suffix`, generating `num_tokens`.
TurnOutput resume_turn(Engine& engine, const std::vector<int32_t>& prompt1, const TurnOutput& turn1,
                       const std::vector<int32_t>& suffix, int num_tokens) {
  std::vector<int32_t> prompt2 = prompt1;
  prompt2.insert(prompt2.end(), turn1.tokens.begin(), turn1.tokens.end());
  prompt2.insert(prompt2.end(), suffix.begin(), suffix.end());
  auto second = engine.submit({"t2", prompt2, greedy(num_tokens), ChainRequest{"c"}});
  EXPECT_TRUE(second.is_ok()) << second.status().to_string();
  return second.is_ok() ? collect(**second) : TurnOutput{};
}

class ChainResumeTest : public ::testing::TestWithParam<MethodCase> {};

TEST_P(ChainResumeTest, ResumedTurnEqualsReplayedTurns) {
  const MethodCase& m = GetParam();
  const ModelBundle bundle = tiny_bundle();
  EngineConfig config = chain_config(m.name, m.config, 4096);
  config.kv_cache_dtype = m.kv_cache_dtype;
  std::mt19937 rng(5);
  const std::vector<int32_t> prompt1 = random_tokens(rng, 70);
  const std::vector<int32_t> suffix = random_tokens(rng, 40);
  const int num_turn1 = m.turn1;
  constexpr int kTurn2 = 8;

  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_EQ((*engine)->config().prefix_cache_mode, "chain");
  auto first = (*engine)->submit({"t1", prompt1, greedy(num_turn1), ChainRequest{"c", /*create=*/true}});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  const TurnOutput turn1 = collect(**first);
  EXPECT_EQ(turn1.last.chain_status, ChainStatus::kCreated);

  const TurnOutput turn2 = resume_turn(**engine, prompt1, turn1, suffix, kTurn2);
  EXPECT_EQ(turn2.last.chain_status, ChainStatus::kResumed);
  // Turn 1's last sampled token was never computed: the state covers every token before it.
  EXPECT_EQ(turn2.last.num_cached_tokens, static_cast<int>(prompt1.size()) + num_turn1 - 1);

  expect_same_turn(turn2, replay_two_turns(bundle, config, prompt1, num_turn1, suffix, kTurn2));
  (*engine)->shutdown(/*drain=*/true);
}

INSTANTIATE_TEST_SUITE_P(
    EvictionMethods, ChainResumeTest,
    ::testing::Values(
        MethodCase{"streamingllm", {{"budget", 32}, {"sink_tokens", 4}}}, MethodCase{"h2o", {{"budget", 32}}},
        MethodCase{"snapkv", {{"budget", 32}, {"window", 8}}}, MethodCase{"pyramidkv", {{"budget", 32}, {"window", 8}}},
        MethodCase{"adakv", {{"budget", 32}, {"window", 8}}}, MethodCase{"chunkkv", {{"budget", 32}, {"window", 8}}},
        MethodCase{"kvzip", {{"ratio", 0.5}, {"chunk_size", 24}}},
        // Turn 1 compresses its generated part several times; turn 2 resumes that state.
        MethodCase{"rkv", {{"budget", 8}, {"buffer", 4}, {"window", 2}, {"kernel", 3}}, "llama", 30},
        MethodCase{
            "kara", {{"window", 8}, {"buffer", 2}, {"candidates", 2}, {"budget", 4}, {"period", 4}}, "llama", 30},
        // Turn 1 sketches its 70-token prompt; turn 2 keeps that sketch and reads every later token exact.
        MethodCase{"shadowkv",
                   {{"sparse_budget", 16},
                    {"chunk_size", 8},
                    {"rank", 8},
                    {"local_chunks", 1},
                    {"outlier_chunks", 1},
                    {"min_prompt_tokens", 64}}},
        // A chain over FP8 pages: the retained codes decode with the scales fixed by turn 1's first chunk.
        MethodCase{"streamingllm", {{"budget", 32}, {"sink_tokens", 4}}, "llama", 6, "fp8"},
        MethodCase{"snapkv", {{"budget", 32}, {"window", 8}}, "llama", 6, "fp8"},
        // A decode-time method over a prompt a prompt-time method compressed: turn 1 compresses both parts, turn 2
        // resumes them (and its prompt, the whole chain, is compressed again by the prompt method).
        MethodCase{"rkv",
                   {{"budget", 8},
                    {"buffer", 4},
                    {"window", 2},
                    {"kernel", 3},
                    {"prompt_method", "snapkv"},
                    {"prompt_config", {{"budget", 32}, {"window", 8}}}},
                   "llama",
                   30,
                   "auto",
                   "rkv_snapkv"},
        MethodCase{"kara",
                   {{"window", 8},
                    {"buffer", 2},
                    {"candidates", 2},
                    {"budget", 4},
                    {"period", 4},
                    {"prompt_method", "snapkv"},
                    {"prompt_config", {{"budget", 32}, {"window", 8}}}},
                   "llama",
                   30,
                   "auto",
                   "kara_snapkv"}),
    [](const ::testing::TestParamInfo<MethodCase>& info) {
      if (info.param.label != nullptr) return std::string(info.param.label);
      const std::string dtype = info.param.kv_cache_dtype;
      return std::string(info.param.name) + (dtype == "auto" ? "" : "_" + dtype);
    });

// SnapKV over KIVI pages through three turns of a chain. Turn 1's prompt is compressed while the store holds it at
// full precision; each later turn resumes the retained key groups (codes, scales, minima) and every stream's residual
// window and appends its tokens as KIVI appends decode tokens. The turns give exactly the tokens and
// log-probabilities of one sequence that takes each turn's new tokens as more prompt without leaving the cache. With
// a window of 32 the kept tokens are quantized by the end of turn 1, so the later turns append without compressing;
// with 128 nothing is quantized yet and SnapKV compresses each later turn's prompt again, as over explicit pages.
// StreamingLLM (budget 40) over KIVI with a window of 32 drops whole sealed groups in every turn, the resumed ones
// included, from the groups its snapshot kept.
struct KiviChainCase {
  const char* kv_cache_dtype;
  int residual;
  const char* method = "snapkv";
};

class ChainOverKiviTest : public ::testing::TestWithParam<KiviChainCase> {};

TEST_P(ChainOverKiviTest, ThreeResumedTurnsEqualOneUninterruptedSequence) {
  const KiviChainCase& k = GetParam();
  const ModelBundle bundle = tiny_bundle();
  const nlohmann::json method_config = std::string(k.method) == "snapkv" ? nlohmann::json{{"budget", 40}, {"window", 8}}
                                                                         : nlohmann::json{{"budget", 40}};
  EngineConfig config = chain_config(k.method, method_config, 4096);
  config.kv_cache_dtype = k.kv_cache_dtype;
  config.kivi_group_size = 32;
  config.kivi_residual = k.residual;
  std::mt19937 rng(7);
  const std::vector<int32_t> prompt1 = random_tokens(rng, 70);
  constexpr int kTurn1 = 6;
  const std::vector<LaterTurn> later = {{random_tokens(rng, 40), 8}, {random_tokens(rng, 24), 8}};

  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_EQ((*engine)->config().prefix_cache_mode, "chain");  // auto, for a method with a chain mode
  auto first = (*engine)->submit({"t1", prompt1, greedy(kTurn1), ChainRequest{"c", /*create=*/true}});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  TurnOutput previous = collect(**first);
  EXPECT_EQ(previous.last.chain_status, ChainStatus::kCreated);
  std::vector<int32_t> context = prompt1;
  std::vector<TurnOutput> resumed;
  for (size_t t = 0; t < later.size(); ++t) {
    context.insert(context.end(), previous.tokens.begin(), previous.tokens.end());
    // The previous turn's last sampled token was never computed: the state covers every token before it.
    const auto num_cached = static_cast<int32_t>(context.size()) - 1;
    context.insert(context.end(), later[t].suffix.begin(), later[t].suffix.end());
    auto next =
        (*engine)->submit({"t" + std::to_string(t + 2), context, greedy(later[t].num_tokens), ChainRequest{"c"}});
    ASSERT_TRUE(next.is_ok()) << next.status().to_string();
    previous = collect(**next);
    EXPECT_EQ(previous.last.chain_status, ChainStatus::kResumed) << t;
    EXPECT_EQ(previous.last.num_cached_tokens, num_cached) << t;
    resumed.push_back(previous);
  }
  const auto info = (*engine)->find_chain("c");
  ASSERT_TRUE(info.has_value());
  EXPECT_GT(info->num_held_pages, 0);
  // 156 tokens against a budget of 40: StreamingLLM dropped sealed groups on the way.
  if (std::string(k.method) == "streamingllm") EXPECT_GT((*engine)->stats().compression_freed_pages_total, 0u);

  const std::vector<TurnOutput> replayed = replay_turns(bundle, config, prompt1, kTurn1, later);
  for (size_t t = 0; t < later.size(); ++t) {
    SCOPED_TRACE("turn " + std::to_string(t + 2));
    expect_same_turn(resumed[t], replayed[t]);
  }
  (*engine)->shutdown(/*drain=*/true);
}

INSTANTIATE_TEST_SUITE_P(SnapKv, ChainOverKiviTest,
                         ::testing::Values(KiviChainCase{"kivi4", 32}, KiviChainCase{"kivi2", 32},
                                           KiviChainCase{"kivi4", 128}),
                         [](const ::testing::TestParamInfo<KiviChainCase>& info) {
                           return std::string(info.param.kv_cache_dtype) + "_residual" +
                                  std::to_string(info.param.residual);
                         });
INSTANTIATE_TEST_SUITE_P(StreamingLlm, ChainOverKiviTest,
                         ::testing::Values(KiviChainCase{"kivi4", 32, "streamingllm"},
                                           KiviChainCase{"kivi2", 32, "streamingllm"}),
                         [](const ::testing::TestParamInfo<KiviChainCase>& info) {
                           return std::string(info.param.kv_cache_dtype);
                         });

// The `keep` best positions of [range.start, range.end) by `scores`, ties to the lower position, ascending.
std::vector<int32_t> best_positions(const std::vector<float>& scores, TokenRange range, int32_t keep) {
  std::vector<int32_t> order(static_cast<size_t>(range.end - range.start));
  std::iota(order.begin(), order.end(), range.start);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return scores[static_cast<size_t>(a)] > scores[static_cast<size_t>(b)];
  });
  order.resize(static_cast<size_t>(keep));
  std::sort(order.begin(), order.end());
  return order;
}

class ChainPruneTest : public ::testing::TestWithParam<MethodCase> {};

// A chain pruned between its turns resumes into exactly what one sequence gives that drops, between the same
// turns, every slot of the range's positions but the policy's best ones (from every stream, the method's
// per-slot metadata following).
TEST_P(ChainPruneTest, ResumedPrunedTurnEqualsReplayWithTheRangeDropped) {
  const MethodCase& m = GetParam();
  const ModelBundle bundle = tiny_bundle(m.model_type);
  const EngineConfig config = chain_config(m.name, m.config, 4096);
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt1 = random_tokens(rng, 70);
  const std::vector<int32_t> suffix = random_tokens(rng, 30);
  constexpr int kTurn1 = 5, kTurn2 = 6;
  const TokenRange range{8, 72};  // ends within a sliding window (8) of the 74 computed tokens
  constexpr int32_t kKeep = 5;

  auto engine = Engine::create(bundle, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  auto first = (*engine)->submit({"t1", prompt1, greedy(kTurn1), ChainRequest{"c", /*create=*/true}});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  const TurnOutput turn1 = collect(**first);
  std::vector<int32_t> computed = prompt1;  // what the retained state stands for: turn 1's last token is uncomputed
  computed.insert(computed.end(), turn1.tokens.begin(), turn1.tokens.end() - 1);
  const int64_t held_before = (*engine)->find_chain("c")->num_held_pages;

  PruneRequest prune;
  prune.chain_id = "c";
  prune.token_ids = computed;  // the chain's prefix, as a client may send it along
  prune.ranges = {range};
  prune.keep_tokens = kKeep;
  prune.window = 8;
  auto prune_id = (*engine)->submit_prune(prune);
  ASSERT_TRUE(prune_id.is_ok()) << prune_id.status().to_string();
  const PruneStatus status = test::wait_for_prune(**engine, *prune_id);
  ASSERT_EQ(status.state, PruneState::kCompleted) << status.reason;

  PruneScoringOptions scoring;
  scoring.window = 8;
  scoring.page_size = kPageSize;
  auto scores = score_positions(*bundle.model, computed, scoring);
  ASSERT_TRUE(scores.is_ok()) << scores.status().to_string();
  const std::vector<int32_t> kept = best_positions(*scores, range, kKeep);
  ASSERT_EQ(status.ranges.size(), 1u);
  EXPECT_EQ(status.ranges[0].kept_positions, kept);
  const ChainInfo after = *(*engine)->find_chain("c");
  EXPECT_FALSE(after.in_flight);
  EXPECT_GT(status.num_freed_pages, 0);
  EXPECT_EQ(status.num_freed_pages, held_before - after.num_held_pages);

  const TurnOutput turn2 = resume_turn(**engine, prompt1, turn1, suffix, kTurn2);
  EXPECT_EQ(turn2.last.chain_status, ChainStatus::kResumed);

  const auto drop_range = [&](SparseController& controller, int32_t seq) {
    CacheManager& cache = controller.cache();
    const ModelConfig& c = bundle.model->config();
    for (int layer = 0; layer < c.num_layers; ++layer) {
      for (int head = 0; head < c.num_kv_heads; ++head) {
        const std::span<const int32_t> positions = cache.slot_positions(seq, layer, head);
        // A sliding-window layer keeps a tail: the positions from the range's end or the window's start on,
        // whichever comes first (what the next query sees, position N, reaches back to N - (W - 1)).
        const bool sliding = c.layers[static_cast<size_t>(layer)].sliding;
        const int32_t tail_start = std::min(range.end, cache.num_logical_tokens(seq) - (c.sliding_window - 1));
        std::vector<int32_t> slots;
        for (int32_t slot = 0; slot < static_cast<int32_t>(positions.size()); ++slot) {
          const int32_t p = positions[static_cast<size_t>(slot)];
          const bool stays = sliding ? p >= tail_start
                                     : p < range.start || p >= range.end || std::count(kept.begin(), kept.end(), p) == 1;
          if (stays) slots.push_back(slot);
        }
        ASSERT_TRUE(cache.evict(seq, layer, head, slots).is_ok());
        controller.method().on_stream_compacted(seq, layer, head, slots);
      }
    }
  };
  expect_same_turn(turn2, replay_two_turns(bundle, config, prompt1, kTurn1, suffix, kTurn2, drop_range));
  (*engine)->shutdown(/*drain=*/true);
}

INSTANTIATE_TEST_SUITE_P(
    EvictionMethods, ChainPruneTest,
    ::testing::Values(MethodCase{"streamingllm", {{"budget", 32}, {"sink_tokens", 4}}},
                      MethodCase{"h2o", {{"budget", 32}}}, MethodCase{"snapkv", {{"budget", 32}, {"window", 8}}},
                      // A budget above the prompt: turn 1 evicts nothing, so the sliding-window layers still
                      // hold every position and the prune cuts them to their tail.
                      MethodCase{"snapkv", {{"budget", 128}, {"window", 8}}, "gemma3_text"},
                      MethodCase{"h2o", {{"budget", 32}}, "gemma3_text"}),
    [](const ::testing::TestParamInfo<MethodCase>& info) {
      const std::string model = info.param.model_type;
      return std::string(info.param.name) + (model == "llama" ? "" : "_" + model);
    });

}  // namespace
}  // namespace se

namespace se {
namespace {

class ChainLifecycleTest : public ::testing::Test {
 protected:
  // 400 pages of 4 tokens: one 70-token turn under SnapKV(32) holds 4 streams x 10 pages after compression; a
  // 300-token plain prompt peaks at 4 x 75 pages + decode, so it only fits once idle chains are reclaimed.
  void SetUp() override {
    auto engine = Engine::create(bundle_, chain_config("snapkv", {{"budget", 32}, {"window", 8}}, 400));
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    engine_ = std::move(*engine);
  }
  void TearDown() override {
    if (engine_) engine_->shutdown(/*drain=*/true);
  }

  Result<TurnOutput> run(const std::string& id, const std::vector<int32_t>& prompt, std::optional<ChainRequest> chain,
                         int max_tokens = 4) {
    SE_ASSIGN_OR_RETURN(auto stream, engine_->submit({id, prompt, greedy(max_tokens), std::move(chain)}));
    return collect(*stream);
  }
  // Every page is free or held by an idle chain.
  void expect_pages_accounted(std::initializer_list<const char*> idle_chains) {
    int64_t num_held = 0;
    for (const char* chain_id : idle_chains) {
      const auto info = engine_->find_chain(chain_id);
      ASSERT_TRUE(info.has_value()) << chain_id;
      EXPECT_FALSE(info->in_flight);
      num_held += info->num_held_pages;
    }
    // Stats are published after the step that finished the last request: wait for them.
    EngineStats stats = engine_->stats();
    for (int i = 0; i < 500 && stats.num_kv_pages_free + num_held != stats.num_kv_pages_total; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      stats = engine_->stats();
    }
    EXPECT_EQ(stats.num_kv_pages_free + num_held, stats.num_kv_pages_total);
  }
  std::vector<int32_t> extend(const std::vector<int32_t>& prompt, const TurnOutput& turn, int num_new) {
    std::vector<int32_t> next = prompt;
    next.insert(next.end(), turn.tokens.begin(), turn.tokens.end());
    const std::vector<int32_t> more = random_tokens(rng_, num_new);
    next.insert(next.end(), more.begin(), more.end());
    return next;
  }

  ModelBundle bundle_ = tiny_bundle();
  std::unique_ptr<Engine> engine_;
  std::mt19937 rng_{9};
};

TEST_F(ChainLifecycleTest, CreateResumeMismatchBusyReclaimGone) {
  const std::vector<int32_t> prompt1 = random_tokens(rng_, 70);
  auto turn1 = run("a1", prompt1, ChainRequest{"a", true});
  ASSERT_TRUE(turn1.is_ok()) << turn1.status().to_string();
  EXPECT_EQ(turn1->last.chain_status, ChainStatus::kCreated);
  EXPECT_EQ(turn1->last.num_cached_tokens, 0);
  expect_pages_accounted({"a"});
  EXPECT_EQ(engine_->find_chain("a")->num_prefix_tokens, 70 + 4);

  const std::vector<int32_t> prompt2 = extend(prompt1, *turn1, 20);
  auto turn2 = run("a2", prompt2, ChainRequest{"a"});
  ASSERT_TRUE(turn2.is_ok()) << turn2.status().to_string();
  EXPECT_EQ(turn2->last.chain_status, ChainStatus::kResumed);
  EXPECT_EQ(turn2->last.num_cached_tokens, 70 + 4 - 1);
  expect_pages_accounted({"a"});

  // A prompt that changed a cached token conflicts and leaves the chain as it was.
  const ChainInfo before = *engine_->find_chain("a");
  std::vector<int32_t> edited = extend(prompt2, *turn2, 5);
  edited[10] = (edited[10] + 1) % 96;
  EXPECT_EQ(run("bad", edited, ChainRequest{"a"}).status().code(), StatusCode::kConflict);
  EXPECT_EQ(engine_->find_chain("a")->digest, before.digest);
  expect_pages_accounted({"a"});

  // Busy: a second turn while one is in flight.
  const std::vector<int32_t> prompt3 = extend(prompt2, *turn2, 10);
  auto in_flight = engine_->submit({"a3", prompt3, greedy(40), ChainRequest{"a"}});
  ASSERT_TRUE(in_flight.is_ok()) << in_flight.status().to_string();
  EXPECT_EQ(run("a3-again", prompt3, ChainRequest{"a"}).status().code(), StatusCode::kConflict);
  const TurnOutput turn3 = collect(**in_flight);
  EXPECT_EQ(turn3.last.chain_status, ChainStatus::kResumed);
  expect_pages_accounted({"a"});

  // A second idle chain, then a large plain request: the pool is short, so idle chains are reclaimed, the least
  // recently used ("a") first.
  auto other = run("b1", random_tokens(rng_, 70), ChainRequest{"b", true});
  ASSERT_TRUE(other.is_ok());
  expect_pages_accounted({"a", "b"});
  auto big = run("big", random_tokens(rng_, 300), std::nullopt, 8);
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  EXPECT_EQ(big->last.finish_reason, FinishReason::kLength);
  EXPECT_FALSE(engine_->find_chain("a").has_value());
  EXPECT_EQ(run("a4", extend(prompt3, turn3, 5), ChainRequest{"a"}).status().code(), StatusCode::kGone);
  EXPECT_EQ(run("z", prompt1, ChainRequest{"never-made"}).status().code(), StatusCode::kNotFound);
  if (engine_->find_chain("b")) {
    expect_pages_accounted({"b"});
  } else {
    expect_pages_accounted({});
  }
}

TEST_F(ChainLifecycleTest, ChainIdsAreUniqueAndAnAbortedTurnDropsItsChain) {
  const std::vector<int32_t> prompt1 = random_tokens(rng_, 20);
  auto turn1 = run("c1", prompt1, ChainRequest{"c", true});
  ASSERT_TRUE(turn1.is_ok());
  EXPECT_EQ(run("c1-again", prompt1, ChainRequest{"c", true}).status().code(), StatusCode::kInvalidArgument);
  expect_pages_accounted({"c"});

  // A continuation that could never fit next to the retained state: 503, and the chain is still there.
  const auto held = engine_->find_chain("c")->num_held_pages;
  std::vector<int32_t> huge = extend(prompt1, *turn1, 1500);
  EXPECT_EQ(run("c-huge", huge, ChainRequest{"c"}).status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(engine_->find_chain("c")->in_flight);
  EXPECT_EQ(engine_->find_chain("c")->num_held_pages, held);

  // A turn aborted once it runs loses its state: the chain answers gone, and every page is back in the pool.
  auto stream = engine_->submit({"c2", extend(prompt1, *turn1, 10), greedy(200), ChainRequest{"c"}});
  ASSERT_TRUE(stream.is_ok());
  ASSERT_TRUE((*stream)->next(std::chrono::milliseconds(60000)).has_value());  // its first token: it runs
  engine_->abort("c2");
  EXPECT_EQ(collect(**stream).last.finish_reason, FinishReason::kAbort);
  EXPECT_EQ(run("c3", extend(prompt1, *turn1, 10), ChainRequest{"c"}).status().code(), StatusCode::kGone);
  expect_pages_accounted({});
}

TEST_F(ChainLifecycleTest, PruneIsBlockedWhileATurnRunsAndFailsForAnUnknownChain) {
  const std::vector<int32_t> prompt1 = random_tokens(rng_, 40);
  auto turn1 = run("p1", prompt1, ChainRequest{"p", true});
  ASSERT_TRUE(turn1.is_ok()) << turn1.status().to_string();
  PruneRequest prune;
  prune.chain_id = "p";
  prune.ranges = {{4, 30}};
  prune.keep_tokens = 2;
  prune.window = 8;

  auto stream = engine_->submit({"p2", extend(prompt1, *turn1, 10), greedy(200), ChainRequest{"p"}});
  ASSERT_TRUE(stream.is_ok());
  ASSERT_TRUE((*stream)->next(std::chrono::milliseconds(60000)).has_value());  // the turn runs
  auto busy = engine_->submit_prune(prune);
  ASSERT_TRUE(busy.is_ok());
  EXPECT_EQ(test::wait_for_prune(*engine_, *busy).state, PruneState::kBlocked);
  engine_->abort("p2");
  // On a loaded machine p2 can finish its tokens before the abort arrives; then "p" stays, idle, with its pages.
  // An aborted turn drops its chain.
  const bool p_kept = collect(**stream).last.finish_reason != FinishReason::kAbort;
  EXPECT_EQ(engine_->find_chain("p").has_value(), p_kept);

  prune.chain_id = "never-made";
  auto unknown = engine_->submit_prune(prune);
  ASSERT_TRUE(unknown.is_ok());
  EXPECT_EQ(test::wait_for_prune(*engine_, *unknown).state, PruneState::kFailed);

  // A range past the chain's prefix fails when the prune runs, and leaves the chain as it was.
  auto idle = run("q1", prompt1, ChainRequest{"q", true});
  ASSERT_TRUE(idle.is_ok());
  const ChainInfo before = *engine_->find_chain("q");
  prune.chain_id = "q";
  prune.ranges = {{4, 400}};
  auto outside = engine_->submit_prune(prune);
  ASSERT_TRUE(outside.is_ok());
  EXPECT_EQ(test::wait_for_prune(*engine_, *outside).state, PruneState::kFailed);
  EXPECT_EQ(engine_->find_chain("q")->num_held_pages, before.num_held_pages);
  if (p_kept) {
    expect_pages_accounted({"p", "q"});
  } else {
    expect_pages_accounted({"q"});
  }
}

// Put back without computing (the scheduler admitted it, then found no room): the request keeps its restored
// state for the next admission. Preempted after computing part of its turn: the state is gone, the request
// recomputes its whole context and reports the chain as rebuilt. No page leaks on either path.
TEST(ChainOracleTest, ReleaseKeepsAnUntouchedStateAndLosesAStartedOne) {
  const Model model = test::tiny_model();
  const ModelConfig& c = model.config();
  auto method = create_method("snapkv", {{"budget", 32}, {"window", 8}});
  ASSERT_TRUE(method.is_ok());
  const KvLayout layout{c.num_layers, c.num_kv_heads, c.head_dim, kPageSize, DType::kF32};
  auto cache = (*method)->create_cache(CacheSpec{layout, 256, cpu_allocator(), false});
  ASSERT_TRUE(cache.is_ok());
  SparseController controller(**method, **cache);
  MemoryOracle oracle(controller, nullptr);
  const int64_t num_total = (*cache)->num_total_pages();

  ASSERT_TRUE(controller.open(/*seq=*/1000, std::vector<int32_t>(12, 7)).is_ok());
  ASSERT_TRUE((*cache)->reserve(1000, 12).is_ok());
  std::unique_ptr<RetainedSequence> retained = controller.retain(1000);
  const int64_t num_held = retained->num_held_pages();
  EXPECT_EQ(num_held, int64_t{layout.num_streams()} * 3);

  Request request("r", std::vector<int32_t>(20, 7), greedy(4));
  request.chain_state = std::move(retained);
  request.chain_status = ChainStatus::kResumed;
  ASSERT_TRUE(oracle.admit(request).is_ok());
  EXPECT_EQ(request.num_computed_tokens, 12);
  EXPECT_EQ(request.num_cached_tokens, 12);
  oracle.release(request);
  ASSERT_NE(request.chain_state, nullptr);
  EXPECT_EQ(request.chain_state->num_held_pages(), num_held);
  EXPECT_EQ((*cache)->num_free_pages(), num_total - num_held);

  ASSERT_TRUE(oracle.admit(request).is_ok());
  ASSERT_TRUE(oracle.try_reserve(request, 8));
  request.num_computed_tokens += 8;  // part of the turn ran
  oracle.release(request);
  EXPECT_EQ(request.chain_state, nullptr);
  EXPECT_EQ((*cache)->num_free_pages(), num_total);
  ASSERT_TRUE(oracle.admit(request).is_ok());
  EXPECT_EQ(request.chain_status, ChainStatus::kRebuilt);
  EXPECT_EQ(request.num_computed_tokens, 0);
  oracle.release(request);
  EXPECT_TRUE((*cache)->check_integrity().is_ok());
  EXPECT_EQ((*cache)->num_free_pages(), num_total);
}

// A retained KIVI state (a key group, its scales and minima, and each stream's window) is reclaimed whole when a
// request needs the pool: the oracle drops it (KIVI keeps no host tier), every one of its pages comes back, and the
// store, the pool and the index stay intact at every step.
TEST(ChainOracleTest, AKiviStateIsReclaimedWholeUnderPressure) {
  const Model model = test::tiny_model();
  const ModelConfig& c = model.config();
  auto method = create_method("snapkv", {{"budget", 40}, {"window", 8}});
  ASSERT_TRUE(method.is_ok());
  const KvLayout layout = make_kv_layout(c.num_layers, c.num_kv_heads, c.head_dim, kPageSize, Device::kCpu,
                                         KvStoreKind::kKivi2, 32, 32, kMaxBatchedTokens);
  constexpr int kBigPrompt = 3 * kMaxBatchedTokens;  // a request that holds the whole pool at its peak
  const auto num_pages = static_cast<int32_t>(KiviCacheManager::held_prompt_pages(layout, kBigPrompt));
  auto cache = (*method)->create_cache(CacheSpec{layout, num_pages, cpu_allocator(), false});
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  SparseController controller(**method, **cache);
  ChainCacheIndex chains;
  MemoryOracle oracle(controller, &chains);
  const auto expect_intact = [&](int64_t num_running_pages) {
    for (const Status& s : {(*cache)->check_integrity(), chains.check_integrity()})
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ((*cache)->num_free_pages() + chains.num_reclaimable_pages() + num_running_pages, num_pages);
  };

  // A 40-token prompt written and computed: its first 32 keys flush into a key group, the rest stay in the window.
  const std::vector<int32_t> tokens(40, 7);
  ASSERT_TRUE(controller.open(/*seq=*/1000, tokens).is_ok());
  ASSERT_TRUE((*cache)->reserve(1000, 40).is_ok());
  ForwardBatch batch;
  batch.sequences.push_back({1000, 0, 40});
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    Tensor k = Tensor::empty(DType::kF32, Shape{40, layout.num_kv_heads, layout.head_dim});
    Tensor v = Tensor::empty(DType::kF32, Shape{40, layout.num_kv_heads, layout.head_dim});
    for (int64_t i = 0; i < k.numel(); ++i) k.data<float>()[i] = normal(rng), v.data<float>()[i] = normal(rng);
    (*cache)->write(layer, (*cache)->build_view(layer, batch), k.view(), v.view());
  }
  (*cache)->on_computed(1000, tokens, 40);
  const AttentionView view = (*cache)->build_sequence_view(1000, 0);
  EXPECT_EQ(view.quantized.kivi_seqs[0].num_quantized_keys[0], 32);
  ASSERT_TRUE(chains.create("k", "f").is_ok());
  chains.end_turn("k", tokens, controller.retain(1000));
  const int64_t num_held = chains.find("k")->num_held_pages;
  EXPECT_GT(num_held, 0);
  expect_intact(0);

  Request big("big", std::vector<int32_t>(kBigPrompt, 5), greedy(1));
  ASSERT_TRUE(oracle.admit(big).is_ok());
  for (int chunk = 0; chunk < 3; ++chunk) {
    ASSERT_TRUE(oracle.try_reserve(big, kMaxBatchedTokens)) << chunk;
    big.num_computed_tokens += kMaxBatchedTokens;
    expect_intact((*cache)->num_held_pages(big.seq));
  }
  EXPECT_FALSE(chains.find("k").has_value());  // dropped for the big request's last chunk
  EXPECT_EQ((*cache)->num_held_pages(big.seq), num_pages);
  oracle.release(big);
  expect_intact(0);
  EXPECT_EQ((*cache)->num_free_pages(), num_pages);
}

// The host tier: idle chains the pool reclaims move to host memory and resume from it. Device pool: 330 pages of
// 4 tokens; SnapKV(32) leaves a 70-token turn of 6 tokens 4 streams x 10 pages, so a 300-token plain request (4 x
// 77 pages at its peak) fits only once both idle chains have yielded theirs.
class ChainHostTierTest : public ::testing::Test {
 protected:
  static constexpr int64_t kDevicePages = 330;
  static constexpr int64_t kPageBytes = 2 * kPageSize * 16 * 4;  // [K, V][page_size][head_dim 16] fp32
  static constexpr int kTurn1 = 6, kTurn2 = 8;

  EngineConfig config(int64_t num_host_pages) const {
    EngineConfig c = chain_config("snapkv", {{"budget", 32}, {"window", 8}}, kDevicePages);
    c.kv_offloading_size = num_host_pages * kPageBytes;
    return c;
  }
  // Chains "c" then "d" finish their first turns; then a large plain request reclaims both.
  void run_turns_then_pressure(Engine& engine) {
    for (const char* chain_id : {"c", "d"}) {
      prompts_.push_back(random_tokens(rng_, 70));
      auto first = engine.submit(
          {std::string(chain_id) + "1", prompts_.back(), greedy(kTurn1), ChainRequest{chain_id, /*create=*/true}});
      ASSERT_TRUE(first.is_ok()) << first.status().to_string();
      turns_.push_back(collect(**first));
    }
    auto big = engine.submit({"big", random_tokens(rng_, 300), greedy(8), std::nullopt});
    ASSERT_TRUE(big.is_ok()) << big.status().to_string();
    EXPECT_EQ(collect(**big).last.finish_reason, FinishReason::kLength);
  }
  // Device pages are free or held by idle chains; host pages are held by the chains on the host.
  static void expect_pages_accounted(Engine& engine, std::initializer_list<const char*> idle_chains) {
    int64_t num_held = 0, num_on_host = 0, num_host_pages = 0;
    for (const char* chain_id : idle_chains) {
      const auto info = engine.find_chain(chain_id);
      ASSERT_TRUE(info.has_value()) << chain_id;
      EXPECT_FALSE(info->in_flight);
      EXPECT_EQ(info->on_host, info->num_host_pages > 0) << chain_id;
      EXPECT_EQ(info->on_host, info->num_held_pages == 0) << chain_id;
      num_held += info->num_held_pages;
      num_on_host += info->on_host;
      num_host_pages += info->num_host_pages;
    }
    EngineStats stats = engine.stats();
    for (int i = 0; i < 500 && stats.num_kv_pages_free + num_held != stats.num_kv_pages_total; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      stats = engine.stats();
    }
    EXPECT_EQ(stats.num_kv_pages_free + num_held, stats.num_kv_pages_total);
    EXPECT_EQ(stats.num_kv_pages_chains, num_held);
    EXPECT_EQ(stats.num_kv_host_pages_used, num_host_pages);
    EXPECT_EQ(stats.num_chains_on_host, num_on_host);
  }

  const ModelBundle bundle_ = tiny_bundle();
  std::mt19937 rng_{21};
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<TurnOutput> turns_;
};

TEST_F(ChainHostTierTest, ReclaimedChainsResumeFromTheHostAsIfNeverMoved) {
  auto engine = Engine::create(bundle_, config(/*num_host_pages=*/100));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_EQ((*engine)->stats().num_kv_host_pages_total, 100);
  run_turns_then_pressure(**engine);
  ASSERT_TRUE((*engine)->find_chain("c").has_value());
  EXPECT_TRUE((*engine)->find_chain("c")->on_host);
  EXPECT_TRUE((*engine)->find_chain("d")->on_host);
  expect_pages_accounted(**engine, {"c", "d"});

  const std::vector<int32_t> suffix = random_tokens(rng_, 40);
  const TurnOutput turn2 = resume_turn(**engine, prompts_[0], turns_[0], suffix, kTurn2);
  EXPECT_EQ(turn2.last.chain_status, ChainStatus::kResumed);
  EXPECT_EQ(turn2.last.num_cached_tokens, 70 + kTurn1 - 1);
  expect_same_turn(turn2, replay_two_turns(bundle_, config(0), prompts_[0], kTurn1, suffix, kTurn2));
  EXPECT_FALSE((*engine)->find_chain("c")->on_host);  // back on the device, most recently used
  expect_pages_accounted(**engine, {"c", "d"});
  (*engine)->shutdown(/*drain=*/true);
}

TEST_F(ChainHostTierTest, AFullHostTierDropsItsLeastRecentlyUsedChain) {
  auto engine = Engine::create(bundle_, config(/*num_host_pages=*/60));  // one chain's 40 pages
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  run_turns_then_pressure(**engine);
  EXPECT_FALSE((*engine)->find_chain("c").has_value());  // moved first, then dropped to make room for "d"
  EXPECT_TRUE((*engine)->find_chain("d")->on_host);
  expect_pages_accounted(**engine, {"d"});
  std::vector<int32_t> prompt2 = prompts_[0];
  prompt2.insert(prompt2.end(), turns_[0].tokens.begin(), turns_[0].tokens.end());
  prompt2.push_back(1);
  EXPECT_EQ((*engine)->submit({"c2", prompt2, greedy(2), ChainRequest{"c"}}).status().code(), StatusCode::kGone);
  (*engine)->shutdown(/*drain=*/true);
}

TEST_F(ChainHostTierTest, WithoutAHostTierReclaimedChainsAreGone) {
  auto engine = Engine::create(bundle_, config(/*num_host_pages=*/0));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  run_turns_then_pressure(**engine);
  EXPECT_FALSE((*engine)->find_chain("c").has_value());
  EXPECT_FALSE((*engine)->find_chain("d").has_value());
  expect_pages_accounted(**engine, {});
  (*engine)->shutdown(/*drain=*/true);
}

// Every byte of every page of sequence `seq`, stream by stream, in slot order.
std::vector<uint8_t> sequence_bytes(CacheManager& cache, int32_t seq) {
  std::vector<uint8_t> bytes;
  for (int layer = 0; layer < cache.layout().num_layers; ++layer) {
    const AttentionView view = cache.build_sequence_view(seq, layer);
    const SeqKvView& sv = view.seqs[0];
    for (int32_t h = 0; h < view.num_kv_heads; ++h) {
      for (int32_t p = 0; p * view.page_size < sv.num_tokens[h]; ++p) {
        const auto* page = static_cast<const uint8_t*>(view.kv_base) +
                           static_cast<size_t>(sv.page_ids[h * sv.stride + p]) * view.page_bytes;
        bytes.insert(bytes.end(), page, page + view.page_bytes);
      }
    }
  }
  return bytes;
}

// A chain state the oracle reclaims moves to the host tier and comes back, byte for byte, when a request
// resumes it; with the device pool full, admission refuses it and the request keeps the state. Both pools and
// the index are checked after every operation.
TEST(ChainOracleTest, AChainStateRoundTripsThroughTheHostTier) {
  const Model model = test::tiny_model();
  const ModelConfig& c = model.config();
  auto method = create_method("snapkv", {{"budget", 32}, {"window", 8}});
  ASSERT_TRUE(method.is_ok());
  const KvLayout layout{c.num_layers, c.num_kv_heads, c.head_dim, kPageSize, DType::kF32};
  auto cache = (*method)->create_cache(CacheSpec{layout, 128, cpu_allocator(), false, 64, cpu_allocator()});
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  SparseController controller(**method, **cache);
  ChainCacheIndex chains;
  MemoryOracle oracle(controller, &chains);
  // `num_taken_host_pages`: host pages of a state a turn took out of the index.
  const auto expect_intact = [&](int64_t num_taken_host_pages = 0) {
    for (const Status& s : {(*cache)->check_integrity(), chains.check_integrity()})
      ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(chains.num_host_pages() + num_taken_host_pages,
              (*cache)->num_host_pages() - (*cache)->num_free_host_pages());
  };

  // A 12-token retained state (4 streams x 3 pages) whose pages hold a known pattern.
  const std::vector<int32_t> tokens(12, 7);
  ASSERT_TRUE(controller.open(/*seq=*/1000, tokens).is_ok());
  ASSERT_TRUE((*cache)->reserve(1000, 12).is_ok());
  std::mt19937 rng(3);
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    const AttentionView view = (*cache)->build_sequence_view(1000, layer);
    for (int32_t h = 0; h < view.num_kv_heads; ++h)
      for (int32_t p = 0; p < 3; ++p) {
        auto* page = static_cast<uint8_t*>(view.kv_base) +
                     static_cast<size_t>(view.seqs[0].page_ids[h * view.seqs[0].stride + p]) * view.page_bytes;
        for (size_t b = 0; b < view.page_bytes; ++b) page[b] = static_cast<uint8_t>(rng());
      }
  }
  const std::vector<uint8_t> written = sequence_bytes(**cache, 1000);
  ASSERT_TRUE(chains.create("x", "f").is_ok());
  chains.end_turn("x", tokens, controller.retain(1000));
  expect_intact();

  // A request that needs the whole pool: the oracle reclaims "x", which moves to the host.
  Request big("big", std::vector<int32_t>(30 * kPageSize, 5), greedy(1));  // 4 streams x 30 of the 128 pages
  ASSERT_TRUE(oracle.admit(big).is_ok());
  ASSERT_TRUE(oracle.try_reserve(big, big.num_tokens()));
  EXPECT_TRUE(chains.find("x")->on_host);
  EXPECT_EQ(chains.find("x")->num_host_pages, 12);
  EXPECT_EQ((*cache)->num_free_pages(), 8);
  expect_intact();

  // Resumed while the pool is full: admission refuses, and the request keeps the offloaded state.
  auto state = chains.begin_turn("x", "f", std::vector<int32_t>(16, 7));
  ASSERT_TRUE(state.is_ok()) << state.status().to_string();
  Request resumed("r", std::vector<int32_t>(16, 7), greedy(4));
  resumed.chain_state = std::move(*state);
  resumed.chain_status = ChainStatus::kResumed;
  EXPECT_EQ(oracle.admit(resumed).code(), StatusCode::kResourceExhausted);
  ASSERT_NE(resumed.chain_state, nullptr);
  EXPECT_TRUE(resumed.chain_state->is_offloaded());
  expect_intact(/*num_taken_host_pages=*/12);

  // Once the pool has room, the state comes back into device pages, byte for byte.
  oracle.release(big);
  expect_intact(/*num_taken_host_pages=*/12);
  ASSERT_TRUE(oracle.admit(resumed).is_ok());
  EXPECT_EQ(resumed.num_computed_tokens, 12);
  EXPECT_EQ(sequence_bytes(**cache, resumed.seq), written);
  EXPECT_EQ((*cache)->num_free_host_pages(), (*cache)->num_host_pages());
  expect_intact();
  oracle.release(resumed);  // untouched: the request keeps the (now device-resident) state
  ASSERT_NE(resumed.chain_state, nullptr);
  EXPECT_FALSE(resumed.chain_state->is_offloaded());
  chains.cancel_turn("x", std::move(resumed.chain_state));
  EXPECT_FALSE(chains.find("x")->on_host);
  expect_intact();
  chains.drop("x");
  EXPECT_EQ((*cache)->num_free_pages(), (*cache)->num_total_pages());
  expect_intact();
}

EngineConfig kivi_chain_config(const std::string& kv_cache_dtype) {
  EngineConfig config = chain_config("snapkv", {{"budget", 40}, {"window", 8}}, 4096);
  config.kv_cache_dtype = kv_cache_dtype;
  config.kivi_group_size = 32;
  config.kivi_residual = 32;  // turn 1's kept tokens fill a key group; the rest stay in the window
  return config;
}

// The lifecycle over KIVI pages: an idle chain holds its key groups and its windows' pages, which the pool's
// accounting counts, and gives every one of them back when it is reclaimed for a larger request or its turn is
// aborted.
class KiviChainLifecycleTest : public ChainLifecycleTest {
 protected:
  // A pool of exactly the peak of a 300-token SnapKV request (its prompt held at full precision, then compressed):
  // it only runs once every idle chain is reclaimed.
  void SetUp() override {
    EngineConfig config = kivi_chain_config("kivi2");
    const ModelConfig& c = bundle_.model->config();
    layout_ =
        make_kv_layout(c.num_layers, c.num_kv_heads, c.head_dim, config.page_size, Device::kCpu, KvStoreKind::kKivi2,
                       config.kivi_group_size, config.kivi_residual, config.max_num_batched_tokens);
    auto method = create_method(config.sparse_method, config.sparse_config);
    ASSERT_TRUE(method.is_ok());
    method_ = std::move(*method);
    config.kv_cache_memory = method_->peak_pages(layout_, kBigPrompt, kBigTokens) *
                             static_cast<int64_t>(layout_.page_bytes() + method_->page_metadata_bytes(layout_));
    auto engine = Engine::create(bundle_, config);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    engine_ = std::move(*engine);
  }
  static constexpr int kBigPrompt = 300;
  static constexpr int kBigTokens = 8;
  KvLayout layout_;
  std::unique_ptr<MethodRuntime> method_;  // the engine's method, for its memory model
};

TEST_F(KiviChainLifecycleTest, ReclaimedAndAbortedChainsGiveBackEveryPage) {
  const std::vector<int32_t> prompt_a = random_tokens(rng_, 70);
  auto a1 = run("a1", prompt_a, ChainRequest{"a", true});
  ASSERT_TRUE(a1.is_ok()) << a1.status().to_string();
  const int64_t held_after_turn1 = engine_->find_chain("a")->num_held_pages;
  EXPECT_GT(held_after_turn1, 0);
  expect_pages_accounted({"a"});
  // A resumed turn appends its tokens to the retained windows and groups: the chain holds more.
  const std::vector<int32_t> prompt_a2 = extend(prompt_a, *a1, 20);
  auto a2 = run("a2", prompt_a2, ChainRequest{"a"});
  ASSERT_TRUE(a2.is_ok()) << a2.status().to_string();
  EXPECT_EQ(a2->last.chain_status, ChainStatus::kResumed);
  EXPECT_GT(engine_->find_chain("a")->num_held_pages, held_after_turn1);
  expect_pages_accounted({"a"});

  // The state bounds its own growth: a continuation of nearly the pool's largest prompt runs beside it, since its
  // tokens append to the windows and flush (never held whole, as the method's peak for a prompt of them counts).
  const ChainInfo before_a3 = *engine_->find_chain("a");
  const std::vector<int32_t> prompt_a3 = extend(prompt_a2, *a2, kBigPrompt - 10);
  const auto num_new = static_cast<int32_t>(prompt_a3.size()) - before_a3.num_prefix_tokens;
  EXPECT_GT(before_a3.num_held_pages + method_->peak_pages(layout_, num_new, 4), engine_->stats().num_kv_pages_total);
  auto a3 = run("a3", prompt_a3, ChainRequest{"a"});
  ASSERT_TRUE(a3.is_ok()) << a3.status().to_string();
  EXPECT_EQ(a3->last.chain_status, ChainStatus::kResumed);
  EXPECT_GT(engine_->find_chain("a")->num_held_pages, before_a3.num_held_pages);
  expect_pages_accounted({"a"});

  const std::vector<int32_t> prompt_b = random_tokens(rng_, 70);
  auto b1 = run("b1", prompt_b, ChainRequest{"b", true});
  ASSERT_TRUE(b1.is_ok()) << b1.status().to_string();
  expect_pages_accounted({"a", "b"});
  auto big = run("big", random_tokens(rng_, kBigPrompt), std::nullopt, kBigTokens);
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  EXPECT_EQ(big->last.finish_reason, FinishReason::kLength);
  EXPECT_FALSE(engine_->find_chain("a").has_value());
  EXPECT_FALSE(engine_->find_chain("b").has_value());
  EXPECT_EQ(run("a4", extend(prompt_a3, *a3, 5), ChainRequest{"a"}).status().code(), StatusCode::kGone);
  expect_pages_accounted({});

  // A turn aborted while it runs drops its chain, with the windows and groups it had resumed.
  const std::vector<int32_t> prompt_c = random_tokens(rng_, 60);
  auto c1 = run("c1", prompt_c, ChainRequest{"c", true});
  ASSERT_TRUE(c1.is_ok()) << c1.status().to_string();
  auto stream = engine_->submit({"c2", extend(prompt_c, *c1, 10), greedy(200), ChainRequest{"c"}});
  ASSERT_TRUE(stream.is_ok());
  ASSERT_TRUE((*stream)->next(std::chrono::milliseconds(60000)).has_value());  // its first token: it runs
  engine_->abort("c2");
  if (collect(**stream).last.finish_reason == FinishReason::kAbort) {
    EXPECT_FALSE(engine_->find_chain("c").has_value());
    expect_pages_accounted({});
  } else {  // on a loaded machine c2 can finish before the abort arrives
    expect_pages_accounted({"c"});
  }
}

// A prune of a KIVI chain whose tokens are quantized fails with the reason and leaves the chain as it was: idle,
// with the same pages, resumable.
TEST_F(KiviChainLifecycleTest, APruneOfQuantizedTokensFailsAndLeavesTheChain) {
  const std::vector<int32_t> prompt1 = random_tokens(rng_, 70);
  auto turn1 = run("p1", prompt1, ChainRequest{"p", true});
  ASSERT_TRUE(turn1.is_ok()) << turn1.status().to_string();
  const ChainInfo before = *engine_->find_chain("p");
  PruneRequest prune;
  prune.chain_id = "p";
  prune.ranges = {{4, 30}};
  prune.keep_tokens = 2;
  prune.window = 8;
  auto id = engine_->submit_prune(prune);
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  const PruneStatus status = test::wait_for_prune(*engine_, *id);
  EXPECT_EQ(status.state, PruneState::kFailed);
  EXPECT_NE(status.reason.find("quantized"), std::string::npos) << status.reason;
  const auto after = engine_->find_chain("p");
  ASSERT_TRUE(after.has_value());
  EXPECT_FALSE(after->in_flight);
  EXPECT_EQ(after->num_held_pages, before.num_held_pages);
  EXPECT_EQ(after->digest, before.digest);
  expect_pages_accounted({"p"});
  auto turn2 = run("p2", extend(prompt1, *turn1, 10), ChainRequest{"p"});
  ASSERT_TRUE(turn2.is_ok()) << turn2.status().to_string();
  EXPECT_EQ(turn2->last.chain_status, ChainStatus::kResumed);
}

// The fingerprint a chain is made under names the KV store, so a turn under another store (or the explicit cache)
// is refused before any of its KV is read; the KIVI cache itself refuses a snapshot another cache took.
TEST(ChainModeTest, AKiviChainResumesOnlyUnderItsOwnStore) {
  const ModelBundle bundle = tiny_bundle();
  std::vector<std::string> fingerprints;
  for (const char* dtype : {"kivi4", "kivi2", "auto"}) {
    auto engine = Engine::create(bundle, kivi_chain_config(dtype));
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    EXPECT_EQ((*engine)->config().prefix_cache_mode, "chain") << dtype;
    fingerprints.push_back((*engine)->chain_fingerprint());
    (*engine)->shutdown(/*drain=*/true);
  }
  EXPECT_NE(fingerprints[0], fingerprints[1]);
  EXPECT_NE(fingerprints[0], fingerprints[2]);
  EXPECT_NE(fingerprints[0].find("kivi4"), std::string::npos) << fingerprints[0];

  // A real KIVI-4 state, retained under the KIVI-4 fingerprint.
  const ModelConfig& c = bundle.model->config();
  const EngineConfig config = kivi_chain_config("kivi4");
  auto method = create_method(config.sparse_method, config.sparse_config);
  ASSERT_TRUE(method.is_ok());
  auto layout_of = [&](KvStoreKind store) {
    return make_kv_layout(c.num_layers, c.num_kv_heads, c.head_dim, kPageSize, Device::kCpu, store,
                          config.kivi_group_size, config.kivi_residual, kMaxBatchedTokens);
  };
  auto kivi4 = (*method)->create_cache(CacheSpec{layout_of(KvStoreKind::kKivi4), 512, cpu_allocator(), false});
  auto kivi2 = (*method)->create_cache(CacheSpec{layout_of(KvStoreKind::kKivi2), 512, cpu_allocator(), false});
  ASSERT_TRUE(kivi4.is_ok() && kivi2.is_ok());
  std::mt19937 rng(3);
  const std::vector<int32_t> tokens = random_tokens(rng, 40);
  ASSERT_TRUE((*kivi4)->open(0, tokens).is_ok());
  ASSERT_TRUE((*kivi4)->reserve(0, 40).is_ok());
  (*kivi4)->on_computed(0, tokens, 40);
  ChainCacheIndex chains;
  ASSERT_TRUE(chains.create("c", fingerprints[0]).is_ok());
  chains.end_turn("c", tokens, std::make_unique<RetainedSequence>((*kivi4)->snapshot(0), nullptr));

  std::vector<int32_t> next = tokens;
  next.push_back(5);
  for (size_t other : {size_t{1}, size_t{2}}) {
    auto refused = chains.begin_turn("c", fingerprints[other], next);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kConflict);
    EXPECT_NE(refused.status().message().find("other settings"), std::string::npos) << refused.status().message();
  }
  auto resumed = chains.begin_turn("c", fingerprints[0], next);
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().to_string();
  auto* retained = dynamic_cast<RetainedSequence*>(resumed->get());
  ASSERT_NE(retained, nullptr);
  std::unique_ptr<SequenceSnapshot> snapshot = retained->take_kv();
  const Status foreign = (*kivi2)->restore(0, std::move(snapshot));  // the refused snapshot is destroyed
  EXPECT_EQ(foreign.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.message().find("KIVI"), std::string::npos) << foreign.message();
  // Its pages went back to the KIVI-4 pool that lent them.
  EXPECT_EQ((*kivi4)->num_free_pages(), (*kivi4)->num_total_pages());
  EXPECT_TRUE((*kivi4)->check_integrity().is_ok());
  EXPECT_TRUE((*kivi2)->check_integrity().is_ok());
  chains.drop("c");
}

TEST(ChainModeTest, ModesFollowTheMethodAndChainRequestsNeedChainMode) {
  const ModelBundle bundle = tiny_bundle();
  EngineConfig vanilla = chain_config("vanilla", nullptr, 400);
  auto radix = Engine::create(bundle, vanilla);
  ASSERT_TRUE(radix.is_ok());
  EXPECT_EQ((*radix)->config().prefix_cache_mode, "radix");
  auto refused = (*radix)->submit({"r", {1, 2, 3}, greedy(2), ChainRequest{"x", true}});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  (*radix)->shutdown(true);

  vanilla.prefix_cache_mode = "chain";
  EXPECT_EQ(Engine::create(bundle, vanilla).status().code(), StatusCode::kInvalidArgument);
  EngineConfig snapkv = chain_config("snapkv", {{"budget", 32}, {"window", 8}}, 400);
  snapkv.prefix_cache_mode = "radix";
  EXPECT_EQ(Engine::create(bundle, snapkv).status().code(), StatusCode::kInvalidArgument);
  snapkv.prefix_cache_mode = "sideways";
  EXPECT_EQ(Engine::create(bundle, snapkv).status().code(), StatusCode::kInvalidArgument);
  snapkv.prefix_cache_mode = "off";
  auto off = Engine::create(bundle, snapkv);
  ASSERT_TRUE(off.is_ok());
  EXPECT_EQ((*off)->submit({"o", {1, 2, 3}, greedy(2), ChainRequest{"x", true}}).status().code(),
            StatusCode::kInvalidArgument);
  (*off)->shutdown(true);
}

}  // namespace
}  // namespace se
