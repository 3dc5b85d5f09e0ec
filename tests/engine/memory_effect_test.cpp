// The memory effect of physical eviction: with one fixed KV pool, SnapKV with budget B must admit at least
// floor(prompt / B) * 0.8 times as many concurrent long-prompt requests as vanilla. The test measures the
// concurrency the real scheduler admits: every request is prefilled (and, under SnapKV, compressed) by the real
// model, controller and cache, then parked (taken off the scheduler's lists with its cache state still held, as a
// request waiting on its client would be), so the resident set only grows while the MemoryOracle finds room.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "../support/tiny_model.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "sparse/method_registry.h"

namespace se {
namespace {

constexpr int kPromptLen = 512;
constexpr int kPageSize = 4;

// Runs steps until nothing more can be scheduled; returns how many requests then hold their cache at once.
int admitted_concurrency(const std::string& method_name, const nlohmann::json& config, int32_t num_pages,
                         int num_requests) {
  Model model = test::tiny_model();
  const ModelConfig& c = model.config();
  auto method = create_method(method_name, config);
  SE_CHECK(method.is_ok(), "{}", method.status().to_string());
  const KvLayout layout{c.num_layers, c.num_kv_heads, c.head_dim, kPageSize, DType::kF32};
  auto cache = (*method)->create_cache(CacheSpec{layout, num_pages, cpu_allocator(), false});
  SE_CHECK(cache.is_ok(), "{}", cache.status().to_string());
  SparseController controller(**method, **cache);
  MemoryOracle oracle(controller);
  Scheduler scheduler(SchedulerConfig{4096, kPromptLen}, oracle);
  ModelRunner runner(model, controller, model.make_workspace());

  std::mt19937 rng(11);
  std::vector<std::unique_ptr<Request>> requests;
  SamplingParams params;
  params.max_tokens = 1;
  for (int i = 0; i < num_requests; ++i) {
    std::vector<int32_t> prompt(kPromptLen);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
    requests.push_back(std::make_unique<Request>(std::to_string(i), prompt, params));
    scheduler.add(requests.back().get());
  }
  std::vector<Request*> parked;
  while (true) {
    StepPlan plan = scheduler.schedule();
    if (plan.empty()) break;
    EXPECT_TRUE(plan.preempted.empty()) << "admission must never need a preemption here";
    runner.execute(plan);  // the sampled tokens are not needed: parked requests generate nothing
    for (const ScheduledRequest& s : plan.scheduled) {
      s.request->num_computed_tokens += s.num_tokens;
      oracle.commit(*s.request);
      if (s.request->num_uncomputed_tokens() == 0) {
        scheduler.remove(s.request);
        parked.push_back(s.request);
      }
    }
    EXPECT_TRUE((*cache)->check_integrity().is_ok());
  }
  EXPECT_FALSE(scheduler.waiting().empty()) << "the pool must run out before the requests do";
  for (Request* r : parked) oracle.release(*r);
  for (Request* r : std::vector<Request*>(scheduler.running().begin(), scheduler.running().end())) oracle.release(*r);
  EXPECT_EQ((*cache)->num_free_pages(), (*cache)->num_total_pages());
  return static_cast<int>(parked.size());
}

TEST(MemoryEffectTest, SnapKvAdmitsPromptOverBudgetTimesMoreConcurrentRequests) {
  const Model model = test::tiny_model();
  const KvLayout layout{model.config().num_layers, model.config().num_kv_heads, model.config().head_dim, kPageSize,
                        DType::kF32};
  // A pool of twelve uncompressed prompts (and a little more).
  const auto num_pages = static_cast<int32_t>(12 * layout.pages_for_tokens(kPromptLen + 1));
  constexpr int kBudget = 28;
  const int vanilla = admitted_concurrency("vanilla", nullptr, num_pages, 40);
  const int snapkv = admitted_concurrency("snapkv", {{"budget", kBudget}, {"window", 8}}, num_pages, 400);
  EXPECT_EQ(vanilla, 12);
  const double required = (kPromptLen / kBudget) * 0.8 * vanilla;
  EXPECT_GE(snapkv, required) << "vanilla admitted " << vanilla << ", snapkv " << snapkv;
  RecordProperty("vanilla_concurrency", vanilla);
  RecordProperty("snapkv_concurrency", snapkv);
}

}  // namespace
}  // namespace se
