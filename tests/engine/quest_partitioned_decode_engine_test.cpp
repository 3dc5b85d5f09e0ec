// Quest's decode through Spin's partitions on the tiny model, against the engine's Quest with every page resident:
// the same greedy tokens and log-probabilities for several prompts. The model runs here with hooks that prefill a
// prompt densely into device pages, hand the sequence to the host tier, index it and offload it whole, then decode
// through PartitionedDecode over a device pool smaller than the sequences' KV, so every step moves pages: never
// more than its selection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "../support/engine_runs.h"
#include "../support/page_pools.h"
#include "../support/tiny_engine.h"
#include "engine/engine.h"
#include "kv/pool_attention_view.h"
#include "sparse/partitioned_decode.h"

namespace se {
namespace {

using test::greedy;
using test::tiny_bundle;

constexpr int32_t kPageSize = 4;
constexpr int32_t kTokenBudget = 8;  // 2 pages per KV head: the last and the best other
constexpr int kMaxTokens = 12;

struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<PartitionStepCounts> steps;  // the partitioned run's page moves per decode step
};

// The engine's Quest, every page resident.
std::vector<Generation> engine_runs(const ModelBundle& bundle, const std::vector<std::vector<int32_t>>& prompts) {
  EngineConfig config;
  config.page_size = kPageSize;
  config.sparse_method = "quest";
  config.sparse_config = {{"token_budget", kTokenBudget}, {"dense_layers", 0}};
  auto engine = Engine::create(bundle, config);
  SE_CHECK(engine.is_ok(), "{}", engine.status().to_string());
  std::vector<Generation> runs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingParams params = greedy(kMaxTokens);
    params.logprobs = 0;
    auto stream = (*engine)->submit({"r" + std::to_string(i), prompts[i], params});
    SE_CHECK(stream.is_ok(), "{}", stream.status().to_string());
    test::Generation run = test::collect(**stream);
    runs.push_back({std::move(run.tokens), std::move(run.logprobs), {}});
  }
  (*engine)->shutdown(/*drain=*/true);
  return runs;
}

// The model's hooks over the host tier: a prefill attends densely over device pages it writes, a decode step goes
// through the partitions.
class TieredQuestHooks final : public ForwardHooks {
 public:
  TieredQuestHooks(const KvLayout& layout, BlockPool* device, BlockPool* host, PartitionConfig config)
      : layout_(layout), device_(device), tier_(device, host), decode_(&tier_, layout, std::move(config)) {}

  HostTier& tier() { return tier_; }
  PartitionedDecode& decode() { return decode_; }

  void begin_forward(const ForwardBatch& batch) override {
    const SequenceSlice& slice = batch.sequences[0];
    decoding_ = slice.is_decode(batch.positions);
    if (decoding_) {
      const Status begun = decode_.begin_step(slice.seq);
      SE_CHECK(begun.is_ok(), "{}", begun.to_string());
      return;
    }
    prefill_ = PageTable(device_, layout_);
    SE_CHECK(prefill_.append(slice.num_tokens).is_ok(), "the prompt does not fit the device pool");
  }

  void attend(int layer, const LayerConfig& /*layer_config*/, const ForwardBatch& batch, TensorView q, TensorView k,
              TensorView v, TensorView out, const AttentionParams& params) override {
    const int32_t seq = batch.sequences[0].seq;
    if (decoding_) {
      const Status attended = decode_.attend(seq, layer, q, k, v, out, params);
      SE_CHECK(attended.is_ok(), "{}", attended.to_string());
      return;
    }
    const PageTableView tv = prefill_.view();
    SeqKvView sv;
    sv.page_ids = tv.pages(layer, 0);
    sv.stride = tv.stride;
    sv.num_tokens = tv.num_tokens + tv.stream(layer, 0);
    const std::vector<int32_t> q_indptr = {0, batch.num_tokens()};
    const AttentionView view = pool_attention_view(layout_, *device_->storage(), {&sv, 1}, q_indptr.data());
    write_kv(view, k, v);
    paged_attention(out, q, view, params);
  }

  // After the prompt's forward: the sequence goes to the tier, is indexed, and leaves the device whole.
  void end_prefill(int32_t seq, int32_t max_num_tokens) {
    SE_CHECK(tier_.add(seq, std::move(prefill_)).is_ok(), "tier add");
    const Status indexed = decode_.add(seq, max_num_tokens);
    SE_CHECK(indexed.is_ok(), "{}", indexed.to_string());
    SE_CHECK(tier_.offload(seq).is_ok(), "offload");
  }

 private:
  KvLayout layout_;
  BlockPool* device_;
  HostTier tier_;
  PartitionedDecode decode_;
  PageTable prefill_{device_, layout_};
  bool decoding_ = false;
};

// Greedy runs of the prompts side by side (one sequence per forward, round robin) through the partitions.
std::vector<Generation> partitioned_runs(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                         PartitionConfig config) {
  const ModelConfig& mc = model.config();
  const KvLayout layout{.num_layers = mc.num_layers,
                        .num_kv_heads = mc.num_kv_heads,
                        .head_dim = mc.head_dim,
                        .page_size = kPageSize,
                        .dtype = DType::kF32};
  // One prompt's prefill fits (<= 16 pages per stream), the sequences' KV together does not.
  BlockPool device = test::pool_with_storage(layout, 80);
  BlockPool host = test::pool_with_storage(layout, 512);
  config.token_budget = kTokenBudget;
  TieredQuestHooks hooks(layout, &device, &host, config);
  ForwardWorkspace workspace = model.make_workspace();
  std::vector<Generation> runs(prompts.size());
  std::vector<std::vector<int32_t>> tokens = prompts;
  // One forward of `seq` over its tokens from `begin`: the next token, greedy, and its log-probability.
  const auto forward = [&](int32_t seq, int32_t begin) {
    const std::vector<int32_t>& all = tokens[static_cast<size_t>(seq)];
    ForwardBatch batch;
    batch.token_ids.assign(all.begin() + begin, all.end());
    for (int32_t p = begin; p < static_cast<int32_t>(all.size()); ++p) batch.positions.push_back(p);
    batch.sequences = {{seq, 0, batch.num_tokens(), static_cast<int32_t>(prompts[static_cast<size_t>(seq)].size())}};
    batch.logit_rows = {batch.num_tokens() - 1};
    const Tensor logits = model.forward(batch, hooks, workspace);
    const float* row = logits.data<float>();
    const auto vocab = static_cast<int32_t>(logits.dim(1));
    const int32_t best = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    double sum = 0;
    for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i] - row[best]));
    Generation& run = runs[static_cast<size_t>(seq)];
    run.tokens.push_back(best);
    run.logprobs.push_back(static_cast<float>(-std::log(sum)));
    tokens[static_cast<size_t>(seq)].push_back(best);
  };
  for (int32_t seq = 0; seq < static_cast<int32_t>(prompts.size()); ++seq) {
    forward(seq, 0);
    hooks.end_prefill(seq, static_cast<int32_t>(prompts[static_cast<size_t>(seq)].size()) + kMaxTokens);
  }
  for (int step = 1; step < kMaxTokens; ++step) {
    for (int32_t seq = 0; seq < static_cast<int32_t>(prompts.size()); ++seq) {
      forward(seq, static_cast<int32_t>(tokens[static_cast<size_t>(seq)].size()) - 1);
      runs[static_cast<size_t>(seq)].steps.push_back(hooks.decode().step_counts(seq));
      SE_CHECK(hooks.tier().check_integrity().is_ok(), "tier integrity");
    }
  }
  for (int32_t seq = 0; seq < static_cast<int32_t>(prompts.size()); ++seq) {
    hooks.decode().remove(seq);
    SE_CHECK(hooks.tier().drop(seq).is_ok(), "drop");
  }
  SE_CHECK(device.num_free_pages() == device.num_total_pages() && host.num_free_pages() == host.num_total_pages(),
           "pages left behind");
  return runs;
}

void expect_same_runs(const std::vector<Generation>& got, const std::vector<Generation>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].tokens, want[r].tokens) << "prompt " << r;
    ASSERT_EQ(got[r].logprobs.size(), want[r].logprobs.size());
    for (size_t t = 0; t < want[r].logprobs.size(); ++t)
      EXPECT_NEAR(got[r].logprobs[t], want[r].logprobs[t], 1e-4f * std::max(1.0f, std::abs(want[r].logprobs[t])))
          << "prompt " << r << " token " << t;
  }
}

class QuestPartitionedDecodeEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(35);
    for (int32_t length : {37, 52, 61}) {
      std::vector<int32_t> prompt(static_cast<size_t>(length));
      for (int32_t& token : prompt) token = static_cast<int32_t>(rng() % 96);
      prompts_.push_back(std::move(prompt));
    }
    reference_ = engine_runs(bundle_, prompts_);
  }

  const ModelBundle bundle_ = tiny_bundle();
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<Generation> reference_;
};

TEST_F(QuestPartitionedDecodeEngineTest, AFixedBufferMovesPagesEveryStepAndDecodesAsResidentQuest) {
  // Four pages: one layer's selection (2 KV heads x 2 pages), so each layer's selection pushes the other's out.
  const std::vector<Generation> runs =
      partitioned_runs(*bundle_.model, prompts_, {.buffer = PartitionBuffer::kFixed, .fixed_buffer_pages = 4});
  expect_same_runs(runs, reference_);
  for (size_t r = 0; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].steps.size(), static_cast<size_t>(kMaxTokens - 1));
    for (size_t s = 0; s < runs[r].steps.size(); ++s) {
      EXPECT_GT(runs[r].steps[s].num_retrieved_pages, 0) << "prompt " << r << " step " << s;
      EXPECT_LE(runs[r].steps[s].num_retrieved_pages, runs[r].steps[s].num_selected_pages)
          << "prompt " << r << " step " << s;
    }
  }
}

TEST_F(QuestPartitionedDecodeEngineTest, AnElasticBufferDecodesAsResidentQuest) {
  const std::vector<Generation> runs =
      partitioned_runs(*bundle_.model, prompts_, {.buffer = PartitionBuffer::kElastic, .buffer_factor = 2});
  expect_same_runs(runs, reference_);
  int64_t retrieved = 0;
  for (const Generation& run : runs) {
    for (const PartitionStepCounts& step : run.steps) {
      EXPECT_LE(step.num_retrieved_pages, step.num_selected_pages);
      retrieved += step.num_retrieved_pages;
    }
  }
  EXPECT_GT(retrieved, 0);
}

TEST_F(QuestPartitionedDecodeEngineTest, TwoLevelSelectKeepingEveryGroupDecodesAsResidentQuest) {
  const TwoLevelConfig every_group{.group_size = 4, .num_groups_kept = 1 << 20};
  expect_same_runs(partitioned_runs(*bundle_.model, prompts_, {.buffer_factor = 2, .two_level = every_group}),
                   reference_);
}

}  // namespace
}  // namespace se
