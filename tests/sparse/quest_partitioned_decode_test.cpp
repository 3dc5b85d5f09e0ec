// Spin's partitions for Quest against Quest over resident KV: several sequences decode side by side, their pages
// offloaded to the host tier after the prefill and the device pool smaller than their KV, so every step retrieves
// what its selection lacks and a full buffer offloads its oldest pages. Each layer's attention output must be the
// resident path's bit for bit (same bounds, same ranking, same kernel over the same bytes); each step moves pages, no
// sequence more than it selected; each request's resident pages stay within its buffer. Elastic and fixed buffers both.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../support/page_pools.h"
#include "backend/ops.h"
#include "kv/pool_attention_view.h"
#include "sparse/partitioned_decode.h"

namespace se {
namespace {

const KvLayout kLayout{.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .page_size = 4, .dtype = DType::kF32};
constexpr int32_t kNumHeads = 4;      // query heads: two per KV head
constexpr int32_t kTokenBudget = 16;  // 4 pages per KV head
constexpr int32_t kMaxTokens = 128;
constexpr int32_t kNumSteps = 12;

Tensor random_tensor(Shape shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

// One sequence's view of one layer over `table` (its pages in `pool`), `num_rows` new tokens.
struct LayerView {
  SeqKvView seq;
  std::vector<int32_t> q_indptr;
  AttentionView view;

  LayerView(const BlockPool& pool, const PageTable& table, int32_t layer, int32_t num_rows) : q_indptr{0, num_rows} {
    const PageTableView tv = table.view();
    seq.page_ids = tv.pages(layer, 0);
    seq.stride = tv.stride;
    seq.num_tokens = tv.num_tokens + tv.stream(layer, 0);
    view = pool_attention_view(kLayout, *pool.storage(), {&seq, 1}, q_indptr.data());
  }
};

// Quest over a resident sequence: bounds per pool page, the same ranking and attention over the selection.
class ResidentQuest {
 public:
  explicit ResidentQuest(BlockPool* pool)
      : pool_(pool),
        bounds_(Tensor::empty(DType::kF32, {pool->num_total_pages(), 2, kLayout.head_dim})),
        lists_(Tensor::empty(DType::kI32, {1, kLayout.num_kv_heads, kTokenBudget / kLayout.page_size})),
        counts_(Tensor::empty(DType::kI32, {1, kLayout.num_kv_heads})) {}

  // Writes k, v [n, Hkv, D] of layer `layer` as the last n tokens of `table` and bounds their pages.
  void write(const PageTable& table, int32_t layer, const Tensor& k, const Tensor& v) {
    const auto n = static_cast<int32_t>(k.dim(0));
    const LayerView lv(*pool_, table, layer, n);
    write_kv(lv.view, k.view(), v.view());
    update_page_key_bounds(bounds_.view(), lv.view, n);
  }

  void attend(const PageTable& table, int32_t layer, const Tensor& q, const Tensor& out) {
    LayerView lv(*pool_, table, layer, 1);
    const int32_t budget = kTokenBudget / kLayout.page_size;
    select_pages_by_key_bounds(lists_.view(), counts_.view(), q.view(), bounds_.view(), lv.view, budget,
                               static_cast<int32_t>(kLayout.pages_per_stream(kMaxTokens)), GroupReduce::kMean);
    lv.seq.selected = lists_.data<int32_t>();
    lv.seq.selected_stride = budget;
    lv.seq.num_selected = counts_.data<int32_t>();
    lv.view.selection_unit = SelectionUnit::kPage;
    lv.view.has_selection = true;
    lv.view.selected_rows_max = 1;
    paged_attention(out.view(), q.view(), lv.view, AttentionParams{.scale = 0.35f});
  }

 private:
  BlockPool* pool_;
  Tensor bounds_, lists_, counts_;
};

struct Moves {
  int64_t retrieved = 0;
  int64_t offloaded = 0;
  int64_t max_resident = 0;
  int64_t ranked = 0;            // pages whose own bounds Select ranked
  int64_t differing_layers = 0;  // layer outputs unlike resident Quest's
};

// Decodes kNumSteps tokens of three prompts side by side through the partitions and through resident Quest,
// expecting the same outputs when `exact`; returns the pages the partitions moved and the outputs that differ.
Moves decode_and_compare(PartitionConfig config, bool exact = true) {
  BlockPool device =
      test::pool_with_storage(kLayout, 96);  // a prompt's prefill fits, the three sequences' KV (~190 pages) does not
  BlockPool host = test::pool_with_storage(kLayout, 512);
  BlockPool reference_pool = test::pool_with_storage(kLayout, 512);
  HostTier tier(&device, &host);
  config.token_budget = kTokenBudget;
  PartitionedDecode decode(&tier, kLayout, config);
  ResidentQuest quest(&reference_pool);
  std::mt19937 rng(35);
  const std::vector<int32_t> prompt_lengths = {61, 80, 45};
  std::vector<PageTable> reference;
  const AttentionParams params{.scale = 0.35f};

  // Prefill: each prompt's KV written on the device, indexed, then offloaded whole (Spin's Offload after Index).
  for (int32_t seq = 0; seq < static_cast<int32_t>(prompt_lengths.size()); ++seq) {
    const int32_t n = prompt_lengths[static_cast<size_t>(seq)];
    PageTable table(&device, kLayout);
    EXPECT_TRUE(table.append(n).is_ok());
    reference.emplace_back(&reference_pool, kLayout);
    EXPECT_TRUE(reference.back().append(n).is_ok());
    for (int32_t l = 0; l < kLayout.num_layers; ++l) {
      const Tensor k = random_tensor({n, kLayout.num_kv_heads, kLayout.head_dim}, rng);
      const Tensor v = random_tensor({n, kLayout.num_kv_heads, kLayout.head_dim}, rng);
      write_kv(LayerView(device, table, l, n).view, k.view(), v.view());
      quest.write(reference.back(), l, k, v);
    }
    EXPECT_TRUE(tier.add(seq, std::move(table)).is_ok());
    const Status indexed = decode.add(seq, kMaxTokens);
    EXPECT_TRUE(indexed.is_ok()) << indexed.to_string();
    EXPECT_TRUE(tier.offload(seq).is_ok());
  }

  Moves moves;
  const Tensor out = Tensor::empty(DType::kF32, {1, kNumHeads, kLayout.head_dim});
  const Tensor expected = Tensor::empty(DType::kF32, {1, kNumHeads, kLayout.head_dim});
  for (int step = 0; step < kNumSteps; ++step) {
    int64_t step_retrieved = 0;
    for (int32_t seq = 0; seq < static_cast<int32_t>(prompt_lengths.size()); ++seq) {
      const Status begun = decode.begin_step(seq);
      EXPECT_TRUE(begun.is_ok()) << begun.to_string();
      EXPECT_TRUE(reference[static_cast<size_t>(seq)].append(1).is_ok());
      for (int32_t l = 0; l < kLayout.num_layers; ++l) {
        const Tensor q = random_tensor({1, kNumHeads, kLayout.head_dim}, rng);
        const Tensor k = random_tensor({1, kLayout.num_kv_heads, kLayout.head_dim}, rng);
        const Tensor v = random_tensor({1, kLayout.num_kv_heads, kLayout.head_dim}, rng);
        const Status attended = decode.attend(seq, l, q.view(), k.view(), v.view(), out.view(), params);
        EXPECT_TRUE(attended.is_ok()) << attended.to_string();
        quest.write(reference[static_cast<size_t>(seq)], l, k, v);
        quest.attend(reference[static_cast<size_t>(seq)], l, q, expected);
        const bool same = std::memcmp(out.raw(), expected.raw(), expected.nbytes()) == 0;
        EXPECT_TRUE(same || !exact) << "step " << step << " sequence " << seq << " layer " << l;
        moves.differing_layers += same ? 0 : 1;
      }
      const PartitionStepCounts& counts = decode.step_counts(seq);
      EXPECT_LE(counts.num_retrieved_pages, counts.num_selected_pages) << "step " << step << " sequence " << seq;
      step_retrieved += counts.num_retrieved_pages;
      moves.ranked += counts.num_ranked_pages;
      moves.offloaded += counts.num_offloaded_pages;
      // Within the buffer, but for the pages the step's token opened.
      const int64_t resident = tier.table(seq).num_device_pages();
      EXPECT_LE(resident, decode.buffer_pages(seq) + kLayout.num_streams()) << "step " << step;
      moves.max_resident = std::max(moves.max_resident, resident);
      EXPECT_TRUE(tier.check_integrity().is_ok());
    }
    // A sequence whose buffer held its whole selection moved nothing, but no step was served from the device alone.
    EXPECT_GT(step_retrieved, 0) << "step " << step;
    moves.retrieved += step_retrieved;
  }
  for (int32_t seq = 0; seq < static_cast<int32_t>(prompt_lengths.size()); ++seq) {
    decode.remove(seq);
    EXPECT_TRUE(tier.drop(seq).is_ok());
  }
  EXPECT_EQ(device.num_free_pages(), device.num_total_pages());
  EXPECT_EQ(host.num_free_pages(), host.num_total_pages());
  return moves;
}

TEST(QuestPartitionedDecodeTest, ElasticBufferDecodesAsResidentQuest) {
  const Moves moves = decode_and_compare({.buffer = PartitionBuffer::kElastic, .buffer_factor = 2});
  EXPECT_GT(moves.offloaded, 0) << "the buffers filled, so Offload ran";
  std::printf("elastic 2x: %lld pages retrieved, %lld offloaded, at most %lld resident per request\n",
              static_cast<long long>(moves.retrieved), static_cast<long long>(moves.offloaded),
              static_cast<long long>(moves.max_resident));
}

TEST(QuestPartitionedDecodeTest, FixedBufferDecodesAsResidentQuest) {
  const Moves small = decode_and_compare({.buffer = PartitionBuffer::kFixed, .fixed_buffer_pages = 12});
  const Moves large = decode_and_compare({.buffer = PartitionBuffer::kFixed, .fixed_buffer_pages = 20});
  // A larger buffer keeps more of what later steps select: fewer retrieves.
  EXPECT_LT(large.retrieved, small.retrieved);
  std::printf("fixed 12: %lld retrieved; fixed 20: %lld retrieved\n", static_cast<long long>(small.retrieved),
              static_cast<long long>(large.retrieved));
}

TEST(QuestPartitionedDecodeTest, TwoLevelSelectKeepingEveryGroupDecodesAsResidentQuest) {
  const Moves flat = decode_and_compare({.buffer_factor = 2});
  const Moves all = decode_and_compare(
      {.buffer_factor = 2, .two_level = TwoLevelConfig{.group_size = 4, .num_groups_kept = 1 << 20}});
  EXPECT_EQ(all.ranked, flat.ranked);
  EXPECT_EQ(all.retrieved, flat.retrieved);
}

TEST(QuestPartitionedDecodeTest, TwoLevelSelectKeepingFewGroupsRanksFewerPages) {
  const Moves flat = decode_and_compare({.buffer_factor = 2});
  const Moves few = decode_and_compare(
      {.buffer_factor = 2, .two_level = TwoLevelConfig{.group_size = 4, .num_groups_kept = 2}}, /*exact=*/false);
  // Two groups of four pages of the 11-20 candidates of each stream: the fine bounds of at most 8 are read.
  EXPECT_LT(few.ranked * 2, flat.ranked);
  std::printf("two-level, 2 groups of 4 kept: %lld of %lld pages ranked, %lld of %d layer outputs differ\n",
              static_cast<long long>(few.ranked), static_cast<long long>(flat.ranked),
              static_cast<long long>(few.differing_layers), kNumSteps * 3 * kLayout.num_layers);
}

TEST(QuestPartitionedDecodeTest, RefusesWhatItCannotServe) {
  BlockPool device = test::pool_with_storage(kLayout, 64);
  BlockPool host = test::pool_with_storage(kLayout, 64);
  HostTier tier(&device, &host);
  PartitionedDecode fixed(&tier, kLayout,
                          {.token_budget = kTokenBudget, .buffer = PartitionBuffer::kFixed, .fixed_buffer_pages = 4});
  PartitionedDecode elastic(&tier, kLayout, {.token_budget = kTokenBudget});
  EXPECT_EQ(elastic.add(0, kMaxTokens).code(), StatusCode::kNotFound);
  PageTable table(&device, kLayout);
  ASSERT_TRUE(table.append(20).is_ok());
  ASSERT_TRUE(tier.add(0, std::move(table)).is_ok());
  // A fixed buffer smaller than one layer's selection (2 heads x 4 pages).
  EXPECT_EQ(fixed.add(0, kMaxTokens).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tier.offload(0, std::vector<StreamPage>{{0, 0}}).is_ok());
  EXPECT_EQ(elastic.add(0, kMaxTokens).code(), StatusCode::kFailedPrecondition) << "indexed only when resident";
  ASSERT_TRUE(tier.retrieve(0).is_ok());
  ASSERT_TRUE(elastic.add(0, 22).is_ok());  // an index of 6 pages per stream: 24 tokens
  EXPECT_EQ(elastic.add(0, 22).code(), StatusCode::kConflict);
  // 8 entries per stream (the 6 pages of 22 tokens, to a power of two): 32 tokens, then twice as many.
  const int64_t index_bytes = elastic.index_bytes(0);
  EXPECT_EQ(index_bytes, elastic.index_bytes_for(32));
  EXPECT_EQ(elastic.index_bytes_for(33), 2 * index_bytes);
  ASSERT_TRUE(elastic.begin_step(0, 12).is_ok());
  EXPECT_EQ(elastic.index_bytes(0), index_bytes);
  ASSERT_TRUE(elastic.begin_step(0).is_ok());
  EXPECT_EQ(elastic.index_bytes(0), 2 * index_bytes) << "past 32 tokens the index doubles";
  const Tensor t = Tensor::empty(DType::kF32, {1, kNumHeads, kLayout.head_dim});
  const Tensor two_rows = Tensor::empty(DType::kF32, {2, kNumHeads, kLayout.head_dim});
  EXPECT_EQ(elastic.attend(0, 0, two_rows.view(), two_rows.view(), two_rows.view(), two_rows.view(), {}).code(),
            StatusCode::kInvalidArgument)
      << "two query rows for a one-token step";
  ASSERT_TRUE(elastic.begin_step(0, 2).is_ok());
  EXPECT_EQ(elastic.attend(0, 0, two_rows.view(), two_rows.view(), two_rows.view(), two_rows.view(), {}).code(),
            StatusCode::kInvalidArgument)
      << "a decode step of two tokens";
  EXPECT_EQ(elastic.attend(0, 2, t.view(), t.view(), t.view(), t.view(), {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(elastic.attend(1, 0, t.view(), t.view(), t.view(), t.view(), {}).code(), StatusCode::kNotFound);
  EXPECT_TRUE(tier.check_integrity().is_ok());
}

}  // namespace
}  // namespace se
