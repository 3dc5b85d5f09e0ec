#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "engine/retained_ranks.h"
#include "sparse/methods/vanilla.h"
#include "sparse/paged_cache_manager.h"

namespace se {
namespace {

// 2 layers x 2 KV heads = 4 streams; a 4-token block costs 4 pages.
KvLayout small_layout() {
  KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 4;
  l.page_size = 4;
  l.dtype = DType::kF32;
  return l;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void make(int num_pages, SchedulerConfig config) {
    cache_ = std::move(PagedCacheManager::create(small_layout(), num_pages, cpu_allocator(), false)).value();
    method_ = std::move(VanillaMethod::create(nullptr)).value();
    controller_ = std::make_unique<SparseController>(*method_, *cache_);
    oracle_ = std::make_unique<MemoryOracle>(*controller_);
    scheduler_ = std::make_unique<Scheduler>(config, *oracle_);
  }
  Request* add(const std::string& id, int prompt_len, int max_tokens = 100) {
    SamplingParams p;
    p.max_tokens = max_tokens;
    auto r = std::make_unique<Request>(id, std::vector<int32_t>(static_cast<size_t>(prompt_len), 7), p);
    Request* raw = r.get();
    requests_[id] = std::move(r);
    scheduler_->add(raw);
    return raw;
  }
  // Plays the step as the engine does: tokens computed, a token sampled where the request caught up.
  void complete(const StepPlan& plan) {
    for (const ScheduledRequest& s : plan.scheduled) {
      s.request->num_computed_tokens += s.num_tokens;
      oracle_->commit(*s.request);
      if (s.request->num_computed_tokens == s.request->num_tokens()) s.request->token_ids.push_back(1);
    }
    ASSERT_TRUE(cache_->check_integrity().is_ok());
  }
  std::map<std::string, int> plan_of(const StepPlan& plan) {
    std::map<std::string, int> m;
    for (const ScheduledRequest& s : plan.scheduled) m[s.request->request_id] = s.num_tokens;
    return m;
  }
  void finish(Request* r) {
    r->state = RequestState::kFinished;
    oracle_->release(*r);
    scheduler_->remove_finished();
  }

  std::unique_ptr<PagedCacheManager> cache_;
  std::unique_ptr<MethodRuntime> method_;
  std::unique_ptr<SparseController> controller_;
  std::unique_ptr<MemoryOracle> oracle_;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<std::string, std::unique_ptr<Request>> requests_;
};

using Plan = std::map<std::string, int>;

TEST_F(SchedulerTest, ChunksPrefillWithinTheBudgetAndMixesDecode) {
  make(256, {8, 8});
  add("a", 10);
  add("b", 3);
  StepPlan p1 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p1), (Plan{{"a", 8}}));  // the budget ends inside a's prompt
  complete(p1);
  StepPlan p2 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p2), (Plan{{"a", 2}, {"b", 3}}));  // a's last chunk and all of b
  complete(p2);
  StepPlan p3 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p3), (Plan{{"a", 1}, {"b", 1}}));  // both decode
  EXPECT_EQ(p3.num_scheduled_tokens, 2);
  complete(p3);
  // A new long prompt joins decoding requests in the same step with what the budget leaves.
  add("c", 20);
  StepPlan p4 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p4), (Plan{{"a", 1}, {"b", 1}, {"c", 6}}));
}

TEST_F(SchedulerTest, RespectsMaxNumSeqs) {
  make(256, {1, 64});
  Request* a = add("a", 4);
  add("b", 4);
  StepPlan p1 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p1), (Plan{{"a", 4}}));
  complete(p1);
  EXPECT_EQ(plan_of(scheduler_->schedule()), (Plan{{"a", 1}}));
  finish(a);
  EXPECT_EQ(plan_of(scheduler_->schedule()), (Plan{{"b", 4}}));
}

TEST_F(SchedulerTest, PreemptsTheNewestAndResumesByRecompute) {
  // 12 pages = 3 blocks of 4 tokens across all streams.
  make(12, {64, 8});
  Request* a = add("a", 6);
  Request* b = add("b", 3);
  StepPlan p1 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p1), (Plan{{"a", 6}, {"b", 2}}));
  complete(p1);
  StepPlan p2 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p2), (Plan{{"a", 1}, {"b", 1}}));  // a decodes its 7th token, b finishes its prompt
  complete(p2);
  StepPlan p3 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p3), (Plan{{"a", 1}, {"b", 1}}));
  complete(p3);
  // a's 9th token needs a third block: b (newest) is preempted, keeping its output token.
  StepPlan p4 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p4), (Plan{{"a", 1}}));
  ASSERT_EQ(p4.preempted.size(), 1u);
  EXPECT_EQ(p4.preempted[0], b);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_EQ(b->num_output_tokens(), 2);
  EXPECT_EQ(b->state, RequestState::kWaiting);
  EXPECT_EQ(b->num_preemptions, 1);
  complete(p4);
  finish(a);
  // b resumes: its prompt and both generated tokens are recomputed in one chunk.
  StepPlan p5 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p5), (Plan{{"b", 5}}));
  complete(p5);
  EXPECT_EQ(b->num_output_tokens(), 3);
  finish(b);
  EXPECT_EQ(cache_->num_free_pages(), cache_->num_total_pages());
}

TEST_F(SchedulerTest, WaitingRequestsDoNotPreemptRunningOnes) {
  make(12, {64, 64});
  add("a", 8);
  StepPlan p1 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p1), (Plan{{"a", 8}}));
  complete(p1);
  add("b", 8);  // needs 8 pages; only 4 are free
  StepPlan p2 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p2), (Plan{{"a", 1}}));
  EXPECT_TRUE(p2.preempted.empty());
  EXPECT_EQ(scheduler_->waiting().size(), 1u);
}

// Peak admission: b waits while a runs, since a's peak (prompt 6 + 4 tokens: 3 blocks, 12 pages) and b's (3 + 4: 8
// pages) do not fit in 12 pages together; where PreemptsTheNewestAndResumesByRecompute preempted b, nothing is, and
// b starts once a finishes.
TEST_F(SchedulerTest, PeakAdmissionWaitsWhereOptimisticAdmissionPreempts) {
  make(12, {64, 8, Admission::kPeak});
  Request* a = add("a", 6, 4);
  Request* b = add("b", 3, 4);
  StepPlan p1 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p1), (Plan{{"a", 6}}));
  complete(p1);
  for (int step = 0; step < 3; ++step) {  // a decodes its 7th to 9th tokens, its 10th sampled
    StepPlan p = scheduler_->schedule();
    EXPECT_EQ(plan_of(p), (Plan{{"a", 1}}));
    EXPECT_TRUE(p.preempted.empty());
    complete(p);
  }
  EXPECT_EQ(a->num_output_tokens(), 4);
  finish(a);
  StepPlan p5 = scheduler_->schedule();
  EXPECT_EQ(plan_of(p5), (Plan{{"b", 3}}));
  complete(p5);
  EXPECT_EQ(b->num_preemptions, 0);
  finish(b);
  EXPECT_EQ(cache_->num_free_pages(), cache_->num_total_pages());
}

TEST_F(SchedulerTest, PeakAdmissionStartsRequestsThatFitTogetherAtTheirPeaks) {
  make(20, {64, 8, Admission::kPeak});  // 12 + 8 pages
  add("a", 6, 4);
  add("b", 3, 4);
  EXPECT_EQ(plan_of(scheduler_->schedule()), (Plan{{"a", 6}, {"b", 2}}));
}

// A state no rank retained: what a chain is when one rank cannot bring its part back.
class ForeignChainState final : public ChainState {
 public:
  int64_t num_held_pages() const override { return 0; }
  int64_t num_host_pages_short() const override { return 0; }
  int32_t num_logical_tokens() const override { return 8; }
};

// Two tensor-parallel ranks: a chained turn whose state one rank cannot resume is rebuilt from its tokens on both
// (rank 0's part, already resumed, is given back), and both pools are whole once it ends.
TEST(MemoryOracleTest, AChainOneRankCannotResumeIsRebuiltOnEveryRank) {
  std::vector<std::unique_ptr<PagedCacheManager>> caches;
  std::vector<std::unique_ptr<SparseController>> controllers;
  std::vector<SparseController*> ranks;
  auto method = std::move(VanillaMethod::create(nullptr)).value();
  for (int r = 0; r < 2; ++r) {
    caches.push_back(std::move(PagedCacheManager::create(small_layout(), 64, cpu_allocator(), false)).value());
    controllers.push_back(std::make_unique<SparseController>(*method, *caches.back()));
    ranks.push_back(controllers.back().get());
  }
  MemoryOracle oracle(ranks);
  SamplingParams params;
  Request first("first", std::vector<int32_t>(8, 7), params);
  ASSERT_TRUE(oracle.admit(first).is_ok());
  ASSERT_TRUE(oracle.try_reserve(first, 8));
  first.num_computed_tokens = 8;
  oracle.commit(first);
  std::unique_ptr<ChainState> retained = oracle.retain(first);
  auto* both = dynamic_cast<RetainedRanks*>(retained.get());
  ASSERT_NE(both, nullptr);
  std::vector<std::unique_ptr<ChainState>> parts = both->take_ranks();
  parts[1] = std::make_unique<ForeignChainState>();

  Request next("next", std::vector<int32_t>(12, 7), params);
  next.chain_state = std::make_unique<RetainedRanks>(std::move(parts));
  next.chain_status = ChainStatus::kResumed;
  ASSERT_TRUE(oracle.admit(next).is_ok());
  EXPECT_EQ(next.chain_status, ChainStatus::kRebuilt);
  EXPECT_EQ(next.num_computed_tokens, 0);  // no prefix cache: the whole conversation is prefilled again
  EXPECT_FALSE(next.chain_state);
  for (const auto& cache : caches) {
    EXPECT_TRUE(cache->check_integrity().is_ok());
    EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());  // rank 0's resumed pages went back
  }
  ASSERT_TRUE(oracle.try_reserve(next, 12));
  next.num_computed_tokens = 12;
  oracle.commit(next);
  next.state = RequestState::kFinished;
  oracle.release(next);
  for (const auto& cache : caches) EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
}

}  // namespace
}  // namespace se
