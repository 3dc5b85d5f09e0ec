// Chain Cache and preemption under Spin's partitions (--kv-partitions --prefix-cache-mode chain) on the tiny model:
// a finished turn's sequence stays whole in the host tier (its pages and the partitions' index), and the next turn
// resumes it without prefilling its tokens again, giving exactly the tokens and log-probabilities of one sequence
// that runs both turns without leaving the cache (Quest, OmniKV, and ShadowKV, whose sketch goes with the chain); a
// preempted request keeps its state there and goes on as an unpreempted run does; a randomized run of chained turns,
// aborts and preemptions over a small host pool keeps the cache and the chain index whole after every step and gives
// both pools back at the end; bad input gets a clear error and leaves the other chains as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "../support/prune_wait.h"
#include "../support/engine_runs.h"
#include "../support/tiny_engine.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/prefix_prune_job.h"
#include "engine/scheduler.h"
#include "sparse/method_registry.h"

namespace se {
namespace {

using test::collect;
using test::Generation;
using test::tiny_bundle;

constexpr int32_t kPageSize = 16;
constexpr int32_t kMaxBatchedTokens = 32;
// The tiny model's pages: 2 layers x 2 KV heads of 16 fp32 channels, K and V; Quest bounds 2 x 16 fp32 per page.
constexpr int64_t kPageBytes = 2 * kPageSize * 16 * 4;
constexpr int64_t kQuestMetadataBytes = 2 * 16 * 4;

struct MethodCase {
  const char* name;
  nlohmann::json config;
  int64_t page_metadata_bytes;  // what the engine sizes its pool with per page
  const char* label = nullptr;  // the test's name when not the method's
};

const MethodCase kQuest{"quest", {{"token_budget", 2 * kPageSize}, {"dense_layers", 0}}, kQuestMetadataBytes};
// Spin's two-level ranking: groups of 2 pages, 2 of them ranked; the chain keeps its summaries and fine bounds.
const MethodCase kQuestTwoLevel{
    "quest",
    {{"token_budget", 2 * kPageSize}, {"dense_layers", 0}, {"two_level_group", 2}, {"two_level_kept_groups", 2}},
    kQuestMetadataBytes,
    "quest_two_level"};
// Layer 0 filters (16 prompt tokens kept), layer 1 reads them and the decode tail.
const MethodCase kOmniKv{"omnikv", {{"filter_layers", {0}}, {"num_wait", 0}, {"num_selected_tokens", 16}}, 0};
// Chunks of 8 tokens, 2 chosen per step beside 2 local and 2 outlier chunks, keys of rank 8: the sketch of turn 1's
// prompt travels with the chain, and turn 2 reads everything past it exact.
const MethodCase kShadowKv{"shadowkv",
                           {{"sparse_budget", 16},
                            {"chunk_size", 8},
                            {"rank", 8},
                            {"local_chunks", 2},
                            {"outlier_chunks", 2},
                            {"min_prompt_tokens", 48}},
                           0};

SamplingParams greedy(int max_tokens) {
  SamplingParams p = test::greedy(max_tokens);
  p.logprobs = 0;
  return p;
}

EngineConfig partitioned_config(const MethodCase& m, int64_t device_pages, int64_t host_pages) {
  EngineConfig config;
  config.page_size = kPageSize;
  config.sparse_method = m.name;
  config.sparse_config = m.config;
  config.kv_cache_memory = device_pages * (kPageBytes + m.page_metadata_bytes);
  config.kv_offloading_size = host_pages * kPageBytes;
  config.kv_partitions = true;
  config.prefix_cache_mode = "chain";
  config.max_num_batched_tokens = kMaxBatchedTokens;
  return config;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % 96);
  return t;
}

// The engine's scheduler, memory oracle, model runner, controller and tiered cache (and chain index), driven step
// by step as the engine drives them, so every step can be checked.
class PartitionedLoop {
 public:
  PartitionedLoop(const Model& model, const EngineConfig& config, bool chains) : model_(model) {
    method_ = create_method(config.sparse_method, config.sparse_config).value();
    const ModelConfig& c = model.config();
    const KvLayout layout =
        make_kv_layout(c.num_layers, c.num_kv_heads, c.head_dim, kPageSize, Device::kCpu, KvStoreKind::kExplicit,
                       config.kivi_group_size, config.kivi_residual, kMaxBatchedTokens);
    const auto num_pages = static_cast<int32_t>(
        config.kv_cache_memory / static_cast<int64_t>(layout.page_bytes() + method_->page_metadata_bytes(layout)));
    CacheSpec spec{layout,
                   num_pages,
                   cpu_allocator(),
                   false,
                   static_cast<int32_t>(config.kv_offloading_size / static_cast<int64_t>(layout.page_bytes())),
                   cpu_allocator()};
    spec.partitions = engine_partition_config(config, *method_, layout).value();
    spec.max_num_batched_tokens = kMaxBatchedTokens;
    cache_ = method_->create_cache(spec).value();
    controller_ = std::make_unique<SparseController>(*method_, *cache_);
    if (chains) chains_ = std::make_unique<ChainCacheIndex>();
    oracle_ = std::make_unique<MemoryOracle>(*controller_, chains_.get());
    scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{8, kMaxBatchedTokens}, *oracle_);
    runner_ = std::make_unique<ModelRunner>(model_, *controller_, model_.make_workspace());
  }

  Request* add(const std::string& id, std::vector<int32_t> tokens, int max_tokens) {
    requests_.push_back(std::make_unique<Request>(id, std::move(tokens), greedy(max_tokens)));
    scheduler_->add(requests_.back().get());
    return requests_.back().get();
  }
  // A turn of chain `chain_id` (created by it, or resuming its idle state), as the engine pins it at submit.
  Result<Request*> add_turn(const std::string& id, std::vector<int32_t> tokens, int max_tokens,
                            const std::string& chain_id, bool create) {
    std::unique_ptr<ChainState> state;
    if (create) {
      SE_RETURN_IF_ERROR(chains_->create(chain_id, "tiny"));
    } else {
      SE_ASSIGN_OR_RETURN(state, chains_->begin_turn(chain_id, "tiny", tokens));
    }
    auto request = std::make_unique<Request>(id, std::move(tokens), greedy(max_tokens));
    request->chain_id = chain_id;
    request->chain_status = create ? ChainStatus::kCreated : ChainStatus::kResumed;
    request->chain_state = std::move(state);
    requests_.push_back(std::move(request));
    scheduler_->add(requests_.back().get());
    return requests_.back().get();
  }

  // One step; false when nothing was scheduled. A request that reached its max_tokens finishes: a chain turn is
  // retained under its chain.
  bool step() {
    last_plan_ = scheduler_->schedule();
    if (last_plan_.empty()) return false;
    const std::vector<SampledToken> sampled = runner_->execute(last_plan_);
    peak_device_pages_in_use_ =
        std::max(peak_device_pages_in_use_, cache_->num_total_pages() - cache_->num_free_pages());
    for (const ScheduledRequest& s : last_plan_.scheduled) {
      s.request->num_computed_tokens += s.num_tokens;
      oracle_->commit(*s.request);
    }
    for (const SampledToken& t : sampled) {
      Request& r = *t.request;
      r.token_ids.push_back(t.sample.token_id);
      logprobs_[&r].push_back(t.sample.logprob);
      if (r.num_output_tokens() < r.params.max_tokens) continue;
      if (!r.chain_id.empty()) {
        chains_->end_turn(r.chain_id, r.token_ids, oracle_->retain(r));
        chains_->park(r.chain_id);
      }
      end(r);
    }
    scheduler_->remove_finished();
    return true;
  }
  // Runs until `request` generated `num_tokens` tokens in all (or finished).
  void run_until(Request& request, int num_tokens) {
    while (request.state != RequestState::kFinished && request.num_output_tokens() < num_tokens)
      SE_CHECK(step(), "nothing to schedule while {} waits", request.request_id);
  }
  // Aborts a request, running or waiting, as the engine does: its chain gets back a state the turn never touched,
  // and is dropped otherwise.
  void abort(Request& r) {
    if (r.chain_state) {
      chains_->cancel_turn(r.chain_id, std::move(r.chain_state));
    } else if (!r.chain_id.empty()) {
      chains_->drop(r.chain_id);
    }
    end(r);
  }

  const std::vector<float>& logprobs(const Request& r) { return logprobs_[&r]; }
  CacheManager& cache() { return *cache_; }
  ChainCacheIndex& chains() { return *chains_; }
  Scheduler& scheduler() { return *scheduler_; }
  MemoryOracle& oracle() { return *oracle_; }
  SparseController& controller() { return *controller_; }
  const StepPlan& last_plan() const { return last_plan_; }
  // The most device pool pages in use after a step's forward.
  int64_t peak_device_pages_in_use() const { return peak_device_pages_in_use_; }

 private:
  void end(Request& r) {
    oracle_->release(r);
    r.kept_state.reset();
    r.state = RequestState::kFinished;
    scheduler_->remove(&r);
  }

  const Model& model_;
  std::unique_ptr<MethodRuntime> method_;
  std::unique_ptr<CacheManager> cache_;
  std::unique_ptr<SparseController> controller_;
  std::unique_ptr<ChainCacheIndex> chains_;  // after cache_: its states go first
  std::unique_ptr<MemoryOracle> oracle_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<std::unique_ptr<Request>> requests_;  // after cache_: kept states go first
  std::map<const Request*, std::vector<float>> logprobs_;
  StepPlan last_plan_;
  int64_t peak_device_pages_in_use_ = 0;
};

// One sequence through both turns without leaving the cache: turn 1 generates `num_turn1` tokens, then the request
// takes on `suffix` as more prompt (prefilled on top, as a resumed chain prefills it) and generates `num_turn2`.
Generation replay_two_turns(const Model& model, const EngineConfig& config, const std::vector<int32_t>& prompt1,
                            int num_turn1, const std::vector<int32_t>& suffix, int num_turn2) {
  PartitionedLoop loop(model, config, /*chains=*/false);
  Request* r = loop.add("replay", prompt1, num_turn1 + num_turn2);
  loop.run_until(*r, num_turn1);
  r->token_ids.insert(r->token_ids.end(), suffix.begin(), suffix.end());
  r->num_prompt_tokens = r->num_tokens();
  r->num_prefill_tokens = r->num_tokens();
  loop.run_until(*r, num_turn2);
  Generation g;
  g.tokens.assign(r->token_ids.end() - num_turn2, r->token_ids.end());
  g.logprobs.assign(loop.logprobs(*r).end() - num_turn2, loop.logprobs(*r).end());
  loop.abort(*r);  // its count of outputs started again with turn 2's prompt
  SE_CHECK(loop.scheduler().running().empty() && loop.cache().num_free_pages() == loop.cache().num_total_pages(),
           "the replay leaked pages");
  return g;
}

class PartitionedChainTest : public ::testing::TestWithParam<MethodCase> {
 protected:
  const ModelBundle bundle_ = tiny_bundle();
};

TEST_P(PartitionedChainTest, AResumedTurnFromTheHostEqualsOneUninterruptedSequence) {
  const MethodCase& m = GetParam();
  // 40 device pages against a conversation of 4 streams x 10 pages: its pages move every step.
  const EngineConfig config = partitioned_config(m, 40, 512);
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt1 = random_tokens(rng, 97);
  const std::vector<int32_t> suffix = random_tokens(rng, 37);
  constexpr int kTurn1 = 8, kTurn2 = 8;

  auto engine = Engine::create(bundle_, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_EQ((*engine)->config().prefix_cache_mode, "chain");
  auto first = (*engine)->submit({"t1", prompt1, greedy(kTurn1), ChainRequest{"c", /*create=*/true}});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  const Generation turn1 = collect(**first);
  // The finished turn's sequence went whole onto the host tier.
  const std::optional<ChainInfo> idle = (*engine)->find_chain("c");
  ASSERT_TRUE(idle.has_value());
  EXPECT_TRUE(idle->on_host);
  EXPECT_EQ(idle->num_held_pages, 0);
  EXPECT_GT(idle->num_host_pages, 4 * 6) << "its KV pages and its index";

  std::vector<int32_t> prompt2 = prompt1;
  prompt2.insert(prompt2.end(), turn1.tokens.begin(), turn1.tokens.end());
  prompt2.insert(prompt2.end(), suffix.begin(), suffix.end());
  auto second = (*engine)->submit({"t2", prompt2, greedy(kTurn2), ChainRequest{"c"}});
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  const Generation turn2 = collect(**second);
  EXPECT_EQ(turn2.last.chain_status, ChainStatus::kResumed);
  // Nothing of the chain is prefilled again: turn 1's last sampled token was never computed.
  EXPECT_EQ(turn2.last.num_cached_tokens, static_cast<int>(prompt1.size()) + kTurn1 - 1);
  (*engine)->shutdown(/*drain=*/true);

  const Generation want = replay_two_turns(*bundle_.model, config, prompt1, kTurn1, suffix, kTurn2);
  EXPECT_EQ(turn2.tokens, want.tokens);
  EXPECT_EQ(turn2.logprobs, want.logprobs);  // exact: the same forward over the same state
}

INSTANTIATE_TEST_SUITE_P(Methods, PartitionedChainTest, ::testing::Values(kQuest, kQuestTwoLevel, kOmniKv, kShadowKv),
                         [](const ::testing::TestParamInfo<MethodCase>& info) {
                           return info.param.label != nullptr ? info.param.label : info.param.name;
                         });

// Quest's indexes take device pages, so requests give way while the host tier has room to keep them (OmniKV's
// only pressure is the two pools' room, which leaves none to keep them in).
TEST(PartitionedPreemptionTest, APreemptedRequestKeepsItsStateAndGoesOnAsUnpreempted) {
  const ModelBundle bundle = tiny_bundle();
  const MethodCase& m = kQuest;
  std::mt19937 rng(12);
  std::vector<std::vector<int32_t>> prompts;
  for (int length : {90, 100, 110}) prompts.push_back(random_tokens(rng, length));
  constexpr int kMaxTokens = 12;
  // Each request alone, in a pool that holds it whole.
  std::vector<Generation> alone;
  for (const auto& prompt : prompts) {
    auto engine = Engine::create(bundle, partitioned_config(m, 128, 512));
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    auto stream = (*engine)->submit({"alone", prompt, greedy(kMaxTokens)});
    ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
    alone.push_back(collect(**stream));
    (*engine)->shutdown(/*drain=*/true);
  }
  // Together in 20 device pages: a layer read whole (2 x 8 pages) beside three indexes (2 pages each) does not fit,
  // so the newest gives way while the host tier has room to keep it.
  auto engine = Engine::create(bundle, partitioned_config(m, 20, 512));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  std::vector<GenerationRequest> batch;
  batch.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    batch.push_back({"r" + std::to_string(i), prompts[i], greedy(kMaxTokens)});
  auto streams = (*engine)->submit_batch(std::move(batch));
  ASSERT_TRUE(streams.is_ok()) << streams.status().to_string();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Generation g = collect(*(*streams)[i]);
    EXPECT_EQ(g.tokens, alone[i].tokens) << "request " << i;
    ASSERT_EQ(g.logprobs.size(), alone[i].logprobs.size());
    // Batched with others, its rows go through GEMMs of other shapes.
    for (size_t t = 0; t < g.logprobs.size(); ++t)
      EXPECT_NEAR(g.logprobs[t], alone[i].logprobs[t], 1e-4f * std::max(1.0f, std::abs(alone[i].logprobs[t])))
          << "request " << i << " token " << t;
  }
  (*engine)->shutdown(/*drain=*/true);
  const EngineStats stats = (*engine)->stats();
  EXPECT_GT(stats.preemptions_total, 0u);
  EXPECT_EQ(stats.num_kv_pages_free, stats.num_kv_pages_total);
  EXPECT_EQ(stats.num_kv_host_pages_used, 0);
}

// Random chained turns (new chains, resumed ones, prompts that do not extend their chain), aborts, and steps
// short of room over a small host tier, with the cache and the chain index checked after every step. Under
// ShadowKV the prompts of 48 tokens or more are sketched, and the sketches go with parked chains and kept requests.
class PartitionedChainRandomTest : public ::testing::TestWithParam<MethodCase> {};

TEST_P(PartitionedChainRandomTest, ChainedTurnsAbortsAndPreemptionKeepEverythingWhole) {
  const ModelBundle bundle = tiny_bundle();
  // 24 device and 48 host pages against up to four conversations of up to 4 streams x 8 pages each: idle chains
  // are parked, dropped for room, and running requests give way.
  PartitionedLoop loop(*bundle.model, partitioned_config(GetParam(), 24, 48), /*chains=*/true);
  constexpr size_t kLongest = 90;  // a chain this long takes no more turns
  std::mt19937 rng(35);
  std::map<std::string, std::vector<int32_t>> conversations;  // chain id -> its tokens so far (idle chains)
  std::vector<Request*> live;
  int num_steps = 0, num_turns = 0, num_resumed = 0, num_aborts = 0, num_preemptions = 0, num_dropped_for_room = 0;
  const auto check = [&](const char* when) {
    for (const Status& s : {loop.cache().check_integrity(), loop.chains().check_integrity()})
      ASSERT_TRUE(s.is_ok()) << when << " at step " << num_steps << ": " << s.to_string();
  };
  for (int round = 0; round < 150; ++round) {
    // A new turn now and then: a fresh chain, or the next turn of an idle one.
    if (live.size() < 4 && rng() % 2 == 0) {
      const std::string id = "turn" + std::to_string(num_turns++);
      std::vector<std::string> idle;
      for (const auto& [chain_id, tokens] : conversations)
        if (tokens.size() <= kLongest && loop.chains().find(chain_id) && !loop.chains().find(chain_id)->in_flight)
          idle.push_back(chain_id);
      if (!idle.empty() && rng() % 3 != 0) {
        const std::string& chain_id = idle[rng() % idle.size()];
        std::vector<int32_t> tokens = conversations[chain_id];
        const std::vector<int32_t> more = random_tokens(rng, 5 + static_cast<int>(rng() % 20));
        tokens.insert(tokens.end(), more.begin(), more.end());
        if (rng() % 8 == 0) {
          tokens[0] = (tokens[0] + 1) % 96;  // edits a cached token: refused, the chain stays
          EXPECT_EQ(loop.add_turn(id, tokens, 6, chain_id, false).status().code(), StatusCode::kConflict);
          check("after a refused turn");
          continue;
        }
        Result<Request*> turn = loop.add_turn(id, tokens, 4 + static_cast<int>(rng() % 6), chain_id, false);
        ASSERT_TRUE(turn.is_ok()) << turn.status().to_string();
        live.push_back(*turn);
        ++num_resumed;
      } else {
        const std::string chain_id = "chain" + std::to_string(num_turns);
        Result<Request*> turn = loop.add_turn(id, random_tokens(rng, 10 + static_cast<int>(rng() % 60)),
                                              4 + static_cast<int>(rng() % 6), chain_id, true);
        ASSERT_TRUE(turn.is_ok()) << turn.status().to_string();
        live.push_back(*turn);
      }
    }
    std::vector<std::string> idle_before;
    for (const auto& [chain_id, tokens] : conversations)
      if (loop.chains().find(chain_id) && !loop.chains().find(chain_id)->in_flight) idle_before.push_back(chain_id);
    if (!loop.step()) continue;
    ++num_steps;
    for (const std::string& chain_id : idle_before) num_dropped_for_room += loop.chains().find(chain_id) ? 0 : 1;
    num_preemptions += static_cast<int>(loop.last_plan().preempted.size());
    check("after a step");
    // Now and then a turn is aborted, running or waiting (its chain is dropped, or gets back its untouched state).
    if (rng() % 11 == 0 && !live.empty()) {
      Request* victim = live[rng() % live.size()];
      if (victim->state != RequestState::kFinished) {
        loop.abort(*victim);
        ++num_aborts;
        check("after an abort");
      }
    }
    for (Request* r : live)
      if (r->state == RequestState::kFinished && loop.chains().find(r->chain_id))
        conversations[r->chain_id] = loop.chains().prefix(r->chain_id);
    std::erase_if(live, [](const Request* r) { return r->state == RequestState::kFinished; });
  }
  while (loop.step()) check("draining");
  EXPECT_TRUE(loop.scheduler().running().empty() && loop.scheduler().waiting().empty());
  for (int t = 0; t <= num_turns; ++t) loop.chains().drop("chain" + std::to_string(t));
  check("at the end");
  EXPECT_EQ(loop.cache().num_free_pages(), loop.cache().num_total_pages());
  EXPECT_EQ(loop.cache().num_free_host_pages(), loop.cache().num_host_pages());
  EXPECT_GT(num_resumed, 3);
  EXPECT_GT(num_aborts, 0);
  EXPECT_GT(num_preemptions, 0) << "no step ran short";
  EXPECT_GT(num_dropped_for_room, 0) << "no idle chain gave its room to running requests";
  RecordProperty("steps", num_steps);
}

INSTANTIATE_TEST_SUITE_P(Methods, PartitionedChainRandomTest, ::testing::Values(kQuest, kShadowKv),
                         [](const ::testing::TestParamInfo<MethodCase>& info) { return info.param.name; });

// A resumed turn put back before it computed a token hands its chain's state back to the host tier, since the device
// keeps only running sequences' pages. When the tier has no room for it (here a preempted request's kept state took
// the last of it) the state is lost as a reclaimed chain's is: nothing of it stays on the device, the turn rebuilds
// the chain from its tokens, and an aborted one leaves the chain gone.
TEST(PartitionedChainReleaseTest, AnUntouchedTurnsStateTheHostCannotTakeBackIsLostNotLeftOnTheDevice) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(15);
  const std::vector<int32_t> chain_prompt = random_tokens(rng, 40), other_prompt = random_tokens(rng, 60);
  struct Outcome {
    int64_t num_host_pages_in_use = 0;  // once the other request is preempted
    int64_t num_turn_pages = 0;         // device pages the resumed turn holds
  };
  // The chain's first turn ends on the host; another request decodes, the chain's second turn is admitted, and the
  // other request is preempted, its state kept on the host; then the second turn is put back.
  const auto run = [&](int64_t host_pages, const std::function<void(PartitionedLoop&, Request&)>& after_release) {
    PartitionedLoop loop(*bundle.model, partitioned_config(kQuest, 64, host_pages), /*chains=*/true);
    Request* first = loop.add_turn("t1", chain_prompt, 2, "c", /*create=*/true).value();
    loop.run_until(*first, 2);
    Request* other = loop.add("other", other_prompt, 8);
    loop.run_until(*other, 2);
    std::vector<int32_t> tokens = first->token_ids;
    tokens.push_back(5);
    Request* second = loop.add_turn("t2", tokens, 2, "c", /*create=*/false).value();
    SE_CHECK(loop.oracle().admit(*second).is_ok(), "admitting the second turn");
    Outcome outcome{.num_turn_pages = loop.cache().num_held_pages(second->seq)};
    loop.oracle().preempt(*other);
    SE_CHECK(other->kept_state != nullptr, "the preempted request's state was not kept");
    outcome.num_host_pages_in_use = loop.cache().num_host_pages() - loop.cache().num_free_host_pages();
    loop.oracle().release(*second);
    after_release(loop, *second);
    loop.abort(*second);
    loop.abort(*other);
    for (const Status& s : {loop.cache().check_integrity(), loop.chains().check_integrity()})
      EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(loop.cache().num_free_pages(), loop.cache().num_total_pages());
    return outcome;
  };
  // With room, the state goes back onto the host and the chain keeps it.
  const Outcome roomy = run(512, [](PartitionedLoop& loop, Request& turn) {
    ASSERT_NE(turn.chain_state, nullptr);
    EXPECT_TRUE(turn.chain_state->is_offloaded());
    EXPECT_EQ(loop.cache().num_free_pages(), loop.cache().num_total_pages());
  });
  ASSERT_GT(roomy.num_turn_pages, 0);
  // One host page short of it: lost, and the device holds nothing of it.
  run(roomy.num_host_pages_in_use + roomy.num_turn_pages - 1, [](PartitionedLoop& loop, Request& turn) {
    EXPECT_EQ(turn.chain_state, nullptr);
    EXPECT_EQ(loop.cache().num_free_pages(), loop.cache().num_total_pages());
    ASSERT_TRUE(loop.oracle().admit(turn).is_ok());
    EXPECT_EQ(turn.chain_status, ChainStatus::kRebuilt);
    EXPECT_EQ(turn.num_computed_tokens, 0);
    loop.oracle().release(turn);
  });
}

// Under the partitions the peak of held pages counts the device pages sequences hold, not total - available (which
// counts the host tier's room as available).
TEST(PartitionedPeakTest, ThePeakOfHeldPagesIsTheDevicePagesInUse) {
  const ModelBundle bundle = tiny_bundle();
  PartitionedLoop loop(*bundle.model, partitioned_config(kQuest, 24, 512), /*chains=*/false);
  std::mt19937 rng(16);
  std::vector<Request*> requests;
  for (int length : {70, 90}) requests.push_back(loop.add("r" + std::to_string(length), random_tokens(rng, length), 4));
  while (loop.step()) {
  }
  EXPECT_GT(loop.peak_device_pages_in_use(), 0);
  EXPECT_EQ(loop.controller().peak_held_pages(), loop.peak_device_pages_in_use());
}

TEST(PartitionedChainErrorsTest, BadInputGetsAClearErrorAndLeavesTheOtherChains) {
  const ModelBundle bundle = tiny_bundle();
  std::mt19937 rng(13);
  // 20 host pages: a 97-token conversation (4 streams x 7 pages, and its index) runs across the two pools but can
  // never be parked on the host; a 20-token one can.
  auto engine = Engine::create(bundle, partitioned_config(kQuest, 40, 20));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  const std::vector<int32_t> small_prompt = random_tokens(rng, 20), big_prompt = random_tokens(rng, 97);
  auto small = (*engine)->submit({"s1", small_prompt, greedy(4), ChainRequest{"small", true}});
  ASSERT_TRUE(small.is_ok());
  const Generation small1 = collect(**small);
  auto big = (*engine)->submit({"b1", big_prompt, greedy(4), ChainRequest{"big", true}});
  ASSERT_TRUE(big.is_ok());
  const Generation big1 = collect(**big);

  EXPECT_EQ((*engine)->submit({"u", small_prompt, greedy(4), ChainRequest{"unknown"}}).status().code(),
            StatusCode::kNotFound);
  std::vector<int32_t> edited = small_prompt;
  edited.insert(edited.end(), small1.tokens.begin(), small1.tokens.end());
  edited.push_back(1);
  edited[3] = (edited[3] + 1) % 96;
  EXPECT_EQ((*engine)->submit({"e", edited, greedy(4), ChainRequest{"small"}}).status().code(), StatusCode::kConflict);

  // A prune of a chain's prefix: the partitions keep every token, so it fails and the chain stays as it was.
  const ChainInfo before = *(*engine)->find_chain("small");
  PruneRequest prune;
  prune.chain_id = "small";
  prune.ranges = {{0, 16}};
  prune.keep_tokens = 2;
  auto pruned = (*engine)->submit_prune(prune);
  ASSERT_TRUE(pruned.is_ok()) << pruned.status().to_string();
  const PruneStatus prune_status = test::wait_for_prune(**engine, *pruned);
  EXPECT_EQ(prune_status.state, PruneState::kFailed);
  EXPECT_NE(prune_status.reason.find("keep every token"), std::string::npos) << prune_status.reason;
  EXPECT_EQ((*engine)->find_chain("small")->digest, before.digest);
  EXPECT_EQ((*engine)->find_chain("small")->num_host_pages, before.num_host_pages);

  // "big" was dropped when its turn ended, and its next turn is told to start over; "small" resumes from the host.
  std::vector<int32_t> big2 = big_prompt;
  big2.insert(big2.end(), big1.tokens.begin(), big1.tokens.end());
  big2.push_back(2);
  const Result<std::shared_ptr<OutputStream>> gone = (*engine)->submit({"b2", big2, greedy(4), ChainRequest{"big"}});
  EXPECT_EQ(gone.status().code(), StatusCode::kGone);
  EXPECT_NE(gone.status().message().find("start a new chain"), std::string::npos) << gone.status().to_string();
  const std::optional<ChainInfo> parked = (*engine)->find_chain("small");
  ASSERT_TRUE(parked.has_value());
  EXPECT_TRUE(parked->on_host);
  std::vector<int32_t> small2 = small_prompt;
  small2.insert(small2.end(), small1.tokens.begin(), small1.tokens.end());
  small2.push_back(3);
  auto resumed = (*engine)->submit({"s2", small2, greedy(4), ChainRequest{"small"}});
  ASSERT_TRUE(resumed.is_ok()) << resumed.status().to_string();
  EXPECT_EQ(collect(**resumed).last.chain_status, ChainStatus::kResumed);
  (*engine)->shutdown(/*drain=*/true);
}

TEST(PartitionedChainErrorsTest, AnotherCachesStateIsRefusedAndBothCachesStayWhole) {
  const ModelBundle bundle = tiny_bundle();
  const EngineConfig config = partitioned_config(kQuest, 40, 64);
  PartitionedLoop one(*bundle.model, config, /*chains=*/false), two(*bundle.model, config, /*chains=*/false);
  std::mt19937 rng(14);
  Request* r = one.add("r", random_tokens(rng, 40), 4);
  one.run_until(*r, 2);
  const int32_t seq = r->seq;
  std::unique_ptr<RetainedSequence> state = one.controller().retain(seq);
  r->seq = -1;
  ASSERT_TRUE(state->offload().is_ok());
  const Result<int32_t> foreign = two.controller().resume(7, std::move(state));
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument) << foreign.status().to_string();
  for (PartitionedLoop* loop : {&one, &two}) {
    EXPECT_TRUE(loop->cache().check_integrity().is_ok());
    EXPECT_EQ(loop->cache().num_free_pages(), loop->cache().num_total_pages());
    EXPECT_EQ(loop->cache().num_free_host_pages(), loop->cache().num_host_pages());
  }
}

// A prune refused under the partitions leaves the chain as it was, its place among the idle chains included.
TEST(PartitionedChainErrorsTest, ARefusedPruneLeavesTheChainsRecency) {
  const ModelBundle bundle = tiny_bundle();
  PartitionedLoop loop(*bundle.model, partitioned_config(kQuest, 40, 512), /*chains=*/true);
  std::mt19937 rng(17);
  for (const char* chain_id : {"older", "newer"}) {
    Request* turn = loop.add_turn(chain_id, random_tokens(rng, 30), 2, chain_id, /*create=*/true).value();
    loop.run_until(*turn, 2);
  }
  ASSERT_EQ(loop.chains().num_chains_on_host(), 2);
  PruneRequest prune;
  prune.chain_id = "older";
  prune.ranges = {{0, 16}};
  prune.keep_tokens = 2;
  const PruneStatus status = run_chain_prune(prune, loop.chains(), loop.controller(), *bundle.model, {});
  EXPECT_EQ(status.state, PruneState::kFailed);
  EXPECT_NE(status.reason.find("keep every token"), std::string::npos) << status.reason;
  // Drops the oldest host chain alone (what is missing never shortens).
  loop.chains().drop_host_chains_while_short([] { return int64_t{1}; });
  EXPECT_FALSE(loop.chains().find("older").has_value()) << "the refused prune made it the most recently used";
  EXPECT_TRUE(loop.chains().find("newer").has_value());
  loop.chains().drop("newer");
  EXPECT_TRUE(loop.chains().check_integrity().is_ok());
}

}  // namespace
}  // namespace se
