// The lifecycle contract: the order the SparseController fires a method's hooks in for prefill chunks, decode
// steps and mixed steps, that hooks only see the step's sequences, capacity accounting around physical
// eviction, snapshots, and the registry's and config reader's errors.
#include "sparse/sparse_controller.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../support/tiny_model.h"
#include "sparse/method_config.h"
#include "sparse/method_registry.h"
#include "sparse/paged_cache_manager.h"

namespace se {
namespace {

// Logs every hook with the batch slots it saw; in finish_step evicts every other token of each sequence whose
// prefill completed this step, checking the whole cache (which the hooks' KvStreams does not show) after each.
class RecordingMethod final : public MethodRuntime {
 public:
  explicit RecordingMethod(const CacheManager& cache) : MethodRuntime("recording", {}), cache_(cache) {}

  void prepare_step(StepContext& ctx) override { log.push_back("prepare " + slots(ctx.batch)); }
  void build_prefill_selection(LayerContext& ctx, int32_t slice, Selection&) override {
    log.push_back(fmt::format("prefill_selection {} {}", ctx.layer, ctx.batch.sequences[slice].seq));
  }
  void build_decode_selection(LayerContext& ctx, int32_t slice, Selection&) override {
    log.push_back(fmt::format("decode_selection {} {}", ctx.layer, ctx.batch.sequences[slice].seq));
  }
  void on_attention_end(LayerContext& ctx) override {
    log.push_back(fmt::format("attention_end {} {}", ctx.layer, slots(ctx.batch)));
  }
  void on_layer_end(int layer, const ForwardBatch& batch, TensorView) override {
    log.push_back(fmt::format("layer_end {} {}", layer, slots(batch)));
  }
  void finish_step(StepContext& ctx) override {
    log.push_back("finish " + slots(ctx.batch));
    for (const SequenceSlice& s : ctx.batch.sequences) {
      if (!s.completes_prefill(ctx.batch.positions)) continue;
      const KvLayout& l = ctx.cache.layout();
      for (int layer = 0; layer < l.num_layers; ++layer)
        for (int h = 0; h < l.num_kv_heads; ++h) {
          std::vector<int32_t> kept;
          for (int32_t j = 0; j < ctx.cache.stream_length(s.seq, layer, h); j += 2) kept.push_back(j);
          ASSERT_TRUE(ctx.cache.evict(s.seq, layer, h, kept).is_ok());
          ASSERT_TRUE(cache_.check_integrity().is_ok());
        }
    }
  }
  void on_sequence_end(int32_t seq) override { log.push_back(fmt::format("end {}", seq)); }

  std::vector<std::string> log;

 private:
  const CacheManager& cache_;
  static std::string slots(const ForwardBatch& batch) {
    std::string s;
    for (const SequenceSlice& slice : batch.sequences) s += std::to_string(slice.seq);
    return s;
  }
};

KvLayout layout_of(const ModelConfig& c) { return KvLayout{c.num_layers, c.num_kv_heads, c.head_dim, 4, DType::kF32}; }

class ControllerTest : public ::testing::Test {
 protected:
  ControllerTest() : model_(test::tiny_model()) {
    cache_ = std::move(PagedCacheManager::create(layout_of(model_.config()), 256, cpu_allocator(), false)).value();
  }
  // One forward of `chunks` = {slot, num_tokens}; prompts are 8 tokens for slot 0 and 4 for slot 1.
  void step(SparseController& controller, const std::vector<std::pair<int, int>>& chunks) {
    ForwardBatch batch;
    for (auto [slot, n] : chunks) {
      ASSERT_TRUE(cache_->reserve(slot, n).is_ok());
      batch.sequences.push_back({slot, batch.num_tokens(), n, slot == 0 ? 8 : 4});
      for (int i = 0; i < n; ++i) {
        batch.token_ids.push_back(3 + i);
        batch.positions.push_back(done_[slot] + i);
      }
      done_[slot] += n;
      batch.logit_rows.push_back(batch.num_tokens() - 1);
    }
    controller.prepare_step(batch);
    ForwardWorkspace workspace = model_.make_workspace();
    model_.forward(batch, controller, workspace);
    controller.finish_step(batch);
  }

  Model model_;
  std::unique_ptr<PagedCacheManager> cache_;
  int done_[2] = {0, 0};
};

TEST_F(ControllerTest, HooksFireInModuleOrderForPrefillDecodeAndMixedSteps) {
  RecordingMethod method(*cache_);
  SparseController controller(method, *cache_);
  ASSERT_TRUE(controller.open(0, {}).is_ok());
  ASSERT_TRUE(controller.open(1, {}).is_ok());
  step(controller, {{0, 5}});          // a prefill chunk of slot 0 only
  step(controller, {{0, 3}, {1, 4}});  // slot 0's last chunk and all of slot 1's prompt
  step(controller, {{1, 1}, {0, 1}});  // two decode tokens
  step(controller, {{0, 1}});          // slot 0 alone: slot 1 sees nothing
  controller.close(1);

  std::vector<std::string> want;
  auto add_step = [&](const std::vector<std::pair<std::string, int>>& selections, const std::string& slots) {
    want.push_back("prepare " + slots);
    for (int layer = 0; layer < 2; ++layer) {
      for (const auto& [kind, slot] : selections) want.push_back(fmt::format("{} {} {}", kind, layer, slot));
      want.push_back(fmt::format("attention_end {} {}", layer, slots));
      want.push_back(fmt::format("layer_end {} {}", layer, slots));
    }
    want.push_back("finish " + slots);
  };
  add_step({{"prefill_selection", 0}}, "0");
  add_step({{"prefill_selection", 0}, {"prefill_selection", 1}}, "01");
  add_step({{"decode_selection", 1}, {"decode_selection", 0}}, "10");
  add_step({{"decode_selection", 0}}, "0");
  want.push_back("end 1");
  EXPECT_EQ(method.log, want);
}

TEST_F(ControllerTest, EvictionReturnsPagesInTheSameStepAndKeepsAccountsBalanced) {
  RecordingMethod method(*cache_);
  SparseController controller(method, *cache_);
  const KvLayout l = cache_->layout();
  ASSERT_TRUE(controller.open(0, {}).is_ok());
  step(controller, {{0, 5}});
  EXPECT_EQ(cache_->num_held_pages(0), l.pages_for_tokens(5));
  step(controller, {{0, 3}});  // completes the 8-token prompt: every stream keeps 4 of 8 tokens
  EXPECT_EQ(cache_->num_held_pages(0), l.pages_for_tokens(4));
  EXPECT_EQ(cache_->num_free_pages() + cache_->num_held_pages(0), cache_->num_total_pages());
  EXPECT_EQ(cache_->num_logical_tokens(0), 8);  // positions keep counting the evicted tokens
  step(controller, {{0, 1}});                   // decode appends after the kept tokens
  EXPECT_EQ(cache_->stream_length(0, 1, 1), 5);
  EXPECT_EQ(cache_->num_logical_tokens(0), 9);
  controller.close(0);
  EXPECT_EQ(cache_->num_free_pages(), cache_->num_total_pages());
  EXPECT_TRUE(cache_->check_integrity().is_ok());
}

TEST_F(ControllerTest, EvictRejectsUnorderedOrOutOfRangeIndicesAndChangesNothing) {
  ASSERT_TRUE(cache_->open(0, {}).is_ok());
  ASSERT_TRUE(cache_->reserve(0, 6).is_ok());
  const int64_t free_before = cache_->num_free_pages();
  EXPECT_FALSE(cache_->evict(0, 0, 0, {3, 1}).is_ok());
  EXPECT_FALSE(cache_->evict(0, 0, 0, {0, 6}).is_ok());
  EXPECT_EQ(cache_->stream_length(0, 0, 0), 6);
  EXPECT_EQ(cache_->num_free_pages(), free_before);
  cache_->close(0);
}

TEST_F(ControllerTest, EvictStreamsChecksEveryStreamBeforeChangingAny) {
  ASSERT_TRUE(cache_->open(0, {}).is_ok());
  ASSERT_TRUE(cache_->reserve(0, 6).is_ok());
  const int64_t free_before = cache_->num_free_pages();
  const std::vector<int32_t> valid = {0, 5};
  const std::vector<int32_t> unordered = {3, 1};
  using Eviction = CacheManager::StreamEviction;
  // A bad list, a stream listed twice or a stream the layout lacks fails the whole call: the valid first stream
  // keeps its six tokens.
  const std::vector<Eviction> bad_second = {{0, 0, valid}, {1, 1, unordered}};
  const std::vector<Eviction> listed_twice = {{0, 0, valid}, {0, 0, valid}};
  const std::vector<Eviction> no_such_layer = {{0, 0, valid}, {99, 0, valid}};
  for (const auto& streams : {bad_second, listed_twice, no_such_layer}) {
    EXPECT_EQ(cache_->evict_streams(0, streams).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(cache_->stream_length(0, 0, 0), 6);
    EXPECT_EQ(cache_->num_free_pages(), free_before);
  }
  // Several streams in one call each keep their own list, positions included.
  const std::vector<int32_t> tail = {3, 4, 5};
  const std::vector<Eviction> two = {{0, 0, valid}, {1, 1, tail}};
  ASSERT_TRUE(cache_->evict_streams(0, two).is_ok());
  EXPECT_EQ(cache_->stream_length(0, 0, 0), 2);
  EXPECT_EQ(cache_->stream_length(0, 1, 1), 3);
  EXPECT_EQ(cache_->stream_length(0, 0, 1), 6);
  EXPECT_EQ(std::vector<int32_t>(cache_->slot_positions(0, 0, 0).begin(), cache_->slot_positions(0, 0, 0).end()),
            valid);
  EXPECT_EQ(std::vector<int32_t>(cache_->slot_positions(0, 1, 1).begin(), cache_->slot_positions(0, 1, 1).end()),
            tail);
  EXPECT_TRUE(cache_->check_integrity().is_ok());
  cache_->close(0);
  EXPECT_EQ(cache_->num_free_pages(), cache_->num_total_pages());
}

TEST_F(ControllerTest, SnapshotAndRestoreKeepTheSequenceState) {
  ASSERT_TRUE(cache_->open(0, {}).is_ok());
  ASSERT_TRUE(cache_->reserve(0, 9).is_ok());
  ASSERT_TRUE(cache_->evict(0, 1, 0, {0, 2, 8}).is_ok());
  const int64_t held = cache_->num_held_pages(0);
  std::unique_ptr<SequenceSnapshot> snap = cache_->snapshot(0);
  EXPECT_EQ(snap->num_held_pages(), held);
  EXPECT_EQ(snap->num_logical_tokens(), 9);
  EXPECT_EQ(cache_->num_free_pages() + held, cache_->num_total_pages());  // still held by the snapshot
  ASSERT_TRUE(cache_->restore(5, std::move(snap)).is_ok());
  EXPECT_EQ(cache_->stream_length(5, 1, 0), 3);
  EXPECT_EQ(cache_->stream_length(5, 1, 1), 9);
  EXPECT_EQ(cache_->num_logical_tokens(5), 9);
  cache_->close(5);
  EXPECT_EQ(cache_->num_free_pages(), cache_->num_total_pages());
  EXPECT_TRUE(cache_->check_integrity().is_ok());
}

TEST(MethodRegistryTest, UnknownMethodsKeysAndRangesAreClearErrors) {
  auto unknown = create_method("nope", nullptr);
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("known: vanilla"), std::string::npos);
  auto bad_key = create_method("vanilla", {{"budget", 3}});
  ASSERT_FALSE(bad_key.is_ok());
  EXPECT_NE(bad_key.status().message().find("unknown --sparse-config key 'budget'"), std::string::npos);
  EXPECT_FALSE(create_method("vanilla", nlohmann::json::array()).is_ok());
  for (const MethodInfo& info : registered_methods()) EXPECT_TRUE(create_method(info.name, nullptr).is_ok()) << info.name;
}

TEST(MethodConfigTest, ReadsDefaultsAndRejectsWrongTypesAndRanges) {
  auto config = MethodConfig::parse("m", {{"budget", 64}, {"ratio", 2.0}, {"pool", "median"}, {"layers", {1, -2}}});
  ASSERT_TRUE(config.is_ok());
  EXPECT_EQ(*config->get_int("budget", 8, 1, 1024), 64);
  EXPECT_EQ(*config->get_int("window", 8, 1, 1024), 8);
  EXPECT_FALSE(config->get_double("ratio", 0.5, 0.0, 1.0).is_ok());
  EXPECT_FALSE(config->get_choice("pool", "avgpool", {"avgpool", "maxpool"}).is_ok());
  EXPECT_FALSE(config->get_int_list("layers", {}, 10).is_ok());
  EXPECT_TRUE(config->finish().is_ok());
  EXPECT_EQ(config->resolved()["window"], 8);
  auto wrong_type = MethodConfig::parse("m", {{"budget", "big"}});
  EXPECT_FALSE(wrong_type->get_int("budget", 8, 1, 1024).is_ok());
}

}  // namespace
}  // namespace se
