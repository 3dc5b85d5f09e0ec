#include "sparse/paged_cache_manager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../support/tiny_model.h"
#include "model/contiguous_kv_cache.h"
#include "sparse/methods/vanilla.h"
#include "sparse/sparse_controller.h"

namespace se {
namespace {

KvLayout layout_of(const ModelConfig& c, int page_size = 4) {
  KvLayout l;
  l.num_layers = c.num_layers;
  l.num_kv_heads = c.num_kv_heads;
  l.head_dim = c.head_dim;
  l.page_size = page_size;
  l.dtype = DType::kF32;
  return l;
}

double max_relative_error(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
    den = std::max(den, std::abs(static_cast<double>(b.data<float>()[i])));
  }
  return num / den;
}

// One step of several sequences: each gets `chunks[s]` new tokens, sequences packed back to back.
struct Step {
  std::vector<int> chunks;
};

// Runs the same token streams through the paged cache (mixed batches) and through the contiguous reference
// (one sequence at a time) and compares every logit row.
void expect_paged_matches_contiguous(const std::string& model_type, const std::vector<Step>& steps, int page_size,
                                     bool prefix_caching) {
  Model model = test::tiny_model(model_type);
  const ModelConfig& c = model.config();
  auto paged = PagedCacheManager::create(layout_of(c, page_size), 4096, cpu_allocator(), prefix_caching);
  ASSERT_TRUE(paged.is_ok()) << paged.status().to_string();
  const int num_seqs = static_cast<int>(steps[0].chunks.size());
  ContiguousKvCache reference(c, num_seqs);
  auto vanilla = VanillaMethod::create(nullptr);
  ASSERT_TRUE(vanilla.is_ok());
  SparseController controller(**vanilla, **paged);
  ForwardWorkspace workspace = model.make_workspace();  // the paged forwards'; the reference runs in its own
  ForwardWorkspace reference_workspace = model.make_workspace();
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> tokens(num_seqs);
  std::vector<int> done(num_seqs, 0);
  for (int s = 0; s < num_seqs; ++s) ASSERT_TRUE((*paged)->open(s, {}).is_ok());

  for (const Step& step : steps) {
    ForwardBatch batch;
    for (int s = 0; s < num_seqs; ++s) {
      const int n = step.chunks[s];
      if (n == 0) continue;
      ASSERT_TRUE((*paged)->reserve(s, n).is_ok());
      batch.sequences.push_back({s, batch.num_tokens(), n});
      for (int i = 0; i < n; ++i) {
        const int32_t t = static_cast<int32_t>(rng() % c.vocab_size);
        tokens[s].push_back(t);
        batch.token_ids.push_back(t);
        batch.positions.push_back(done[s] + i);
      }
      batch.logit_rows.push_back(batch.num_tokens() - 1);
    }
    const Tensor got = model.forward(batch, controller, workspace);
    for (size_t i = 0; i < batch.sequences.size(); ++i) {
      const SequenceSlice& slice = batch.sequences[i];
      ForwardBatch single;
      single.token_ids.assign(batch.token_ids.begin() + slice.token_begin,
                              batch.token_ids.begin() + slice.token_begin + slice.num_tokens);
      single.positions.assign(batch.positions.begin() + slice.token_begin,
                              batch.positions.begin() + slice.token_begin + slice.num_tokens);
      single.sequences = {{slice.seq, 0, slice.num_tokens}};
      single.logit_rows = {slice.num_tokens - 1};
      Tensor want = model.forward(single, reference, reference_workspace);
      Tensor got_row = got.slice_rows(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1);
      EXPECT_LT(max_relative_error(got_row, want), 1e-5) << "sequence " << slice.seq;
      done[slice.seq] += slice.num_tokens;
      (*paged)->on_computed(slice.seq, tokens[slice.seq], done[slice.seq]);
    }
    ASSERT_TRUE((*paged)->check_integrity().is_ok()) << (*paged)->check_integrity().to_string();
  }
  for (int s = 0; s < num_seqs; ++s) (*paged)->close(s);
  EXPECT_TRUE((*paged)->check_integrity().is_ok());
}

TEST(PagedCacheManagerTest, ChunkedPrefillAndDecodeMatchContiguous) {
  // One sequence: a prompt in uneven chunks crossing page boundaries, then decode steps.
  expect_paged_matches_contiguous("llama", {{{5}}, {{7}}, {{1}}, {{1}}, {{3}}, {{1}}}, 4, false);
}

TEST(PagedCacheManagerTest, MixedPrefillAndDecodeStepsMatchContiguous) {
  // Three sequences: steps mix decode tokens with prefill chunks of others.
  expect_paged_matches_contiguous("qwen3", {{{9, 0, 3}}, {{1, 6, 0}}, {{1, 1, 5}}, {{1, 1, 1}}, {{2, 1, 1}}}, 4, true);
}

TEST(PagedCacheManagerTest, SlidingWindowLayersMatchContiguous) {
  // Gemma 3 shape: window 8 on every other layer; sequences grow past the window.
  expect_paged_matches_contiguous("gemma3_text", {{{11, 3}}, {{1, 9}}, {{1, 1}}, {{6, 1}}, {{1, 1}}}, 4, false);
}

TEST(PagedCacheManagerTest, PrefixCacheReusesFullBlocksAndFreesOnClose) {
  Model model = test::tiny_model();
  auto cache = PagedCacheManager::create(layout_of(model.config(), 4), 512, cpu_allocator(), true);
  ASSERT_TRUE(cache.is_ok());
  std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};  // 2 full blocks + 2
  ASSERT_EQ(*(*cache)->open(0, prompt), 0);
  ASSERT_TRUE((*cache)->reserve(0, 10).is_ok());
  (*cache)->on_computed(0, prompt, 10);
  (*cache)->close(0);
  // The same prompt again: the two full blocks are cached; the rest is computed.
  auto hit = (*cache)->open(1, prompt);
  ASSERT_TRUE(hit.is_ok());
  EXPECT_EQ(*hit, 8);
  EXPECT_EQ((*cache)->prefix_cache_counters().hit_tokens, 8);
  (*cache)->close(1);
  EXPECT_TRUE((*cache)->check_integrity().is_ok());
  // Everything not cached is free; the cached blocks are reclaimable.
  EXPECT_EQ((*cache)->num_available_pages(), (*cache)->num_total_pages());
}

TEST(PagedCacheManagerTest, SharedLatentStoreHalvesPagesAndRefusesPruning) {
  // DeepSeek-V2-Lite's latent row: kv_lora_rank 512 + qk_rope 64, one "KV head".
  KvLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 1;
  layout.head_dim = 576;
  layout.page_size = 4;
  layout.dtype = DType::kF32;
  const size_t explicit_bytes = layout.page_bytes();
  layout.store = KvStoreKind::kSharedLatent;
  EXPECT_EQ(layout.page_bytes() * 2, explicit_bytes);  // no V half
  auto cache = PagedCacheManager::create(layout, 64, cpu_allocator(), true);
  ASSERT_TRUE(cache.is_ok());
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  ASSERT_EQ(*(*cache)->open(0, prompt), 0);
  ASSERT_TRUE((*cache)->reserve(0, 10).is_ok());
  ForwardBatch batch;
  batch.token_ids = prompt;
  for (int32_t i = 0; i < 10; ++i) batch.positions.push_back(i);
  batch.sequences = {{0, 0, 10}};
  const AttentionView view = (*cache)->build_view(1, batch);
  EXPECT_EQ(view.payload, KvPayload::kSharedLatent);
  EXPECT_EQ(view.page_bytes, layout.page_bytes());
  (*cache)->on_computed(0, prompt, 10);
  (*cache)->close(0);
  const Status refused = (*cache)->check_prunable(prompt, {0, 2});
  EXPECT_EQ(refused.code(), StatusCode::kUnimplemented);
  EXPECT_NE(refused.message().find("shared-latent"), std::string::npos) << refused.message();
  EXPECT_TRUE((*cache)->check_integrity().is_ok());
}

std::vector<int32_t> positions_of(const CacheManager& cache, int32_t seq, int layer, int head) {
  const std::span<const int32_t> p = cache.slot_positions(seq, layer, head);
  return {p.begin(), p.end()};
}

TEST(PagedCacheManagerTest, PositionMapFollowsEvictionTruncationAndSnapshots) {
  Model model = test::tiny_model();
  auto cache = PagedCacheManager::create(layout_of(model.config(), 4), 512, cpu_allocator(), false);
  ASSERT_TRUE(cache.is_ok());
  CacheManager& c = **cache;
  ASSERT_TRUE(c.open(0, {}).is_ok());
  ASSERT_TRUE(c.reserve(0, 10).is_ok());
  EXPECT_EQ(positions_of(c, 0, 1, 1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  ASSERT_TRUE(c.evict(0, 1, 1, {0, 4, 8, 9}).is_ok());
  ASSERT_TRUE(c.reserve(0, 2).is_ok());  // new tokens keep their absolute positions
  EXPECT_EQ(positions_of(c, 0, 1, 1), (std::vector<int32_t>{0, 4, 8, 9, 10, 11}));
  EXPECT_EQ(positions_of(c, 0, 0, 0).size(), 12u);
  ASSERT_TRUE(c.truncate(0, 11).is_ok());
  EXPECT_EQ(positions_of(c, 0, 1, 1), (std::vector<int32_t>{0, 4, 8, 9, 10}));
  EXPECT_EQ(positions_of(c, 0, 0, 1).back(), 10);
  // A snapshot carries the map: restored under another slot, the streams hold the same positions.
  ASSERT_TRUE(c.restore(3, c.snapshot(0)).is_ok());
  EXPECT_EQ(positions_of(c, 3, 1, 1), (std::vector<int32_t>{0, 4, 8, 9, 10}));
  EXPECT_EQ(positions_of(c, 3, 1, 0).size(), 11u);
  c.close(3);
  EXPECT_TRUE(c.check_integrity().is_ok());
}

// evict_slots: each listed stream's last token takes the evicted slot (KV and position), a page the stream no longer
// needs stays as its spare for the next token (the table's epoch holds), and bad input changes nothing.
TEST(PagedCacheManagerTest, EvictSlotsRefillsTheSlotWithTheLastToken) {
  Model model = test::tiny_model();
  auto cache = PagedCacheManager::create(layout_of(model.config(), 4), 512, cpu_allocator(), false);
  ASSERT_TRUE(cache.is_ok());
  PagedCacheManager& c = **cache;
  ASSERT_TRUE(c.open(0, {}).is_ok());
  ASSERT_TRUE(c.reserve(0, 9).is_ok());  // 3 pages a stream, the last holding one token
  const int32_t head_dim = c.layout().head_dim;
  // Every K and V element of token t of stream s holds 1000 s + 10 t (+ 1 for V).
  const AttentionView pool = c.build_sequence_view(0, 0);
  const auto slot_of = [&](int layer, int head, int32_t token) { return c.table(0)->slot(layer, head, token); };
  for (int layer = 0; layer < c.layout().num_layers; ++layer)
    for (int head = 0; head < c.layout().num_kv_heads; ++head)
      for (int32_t t = 0; t < 9; ++t)
        for (int kv = 0; kv < 2; ++kv) {
          const PageSlot at = slot_of(layer, head, t);
          float* row = pool.element<float>(at.page_id, kv, at.offset);
          std::fill(row, row + head_dim, 1000.0f * c.layout().stream(layer, head) + 10.0f * t + kv);
        }
  const int64_t free_before = c.num_free_pages();

  const std::vector<CacheManager::SlotEviction> bad = {{1, 1, 2}, {0, 0, 9}};  // stream (0, 0) has no slot 9
  EXPECT_EQ(c.evict_slots(0, bad).code(), StatusCode::kInvalidArgument);
  const std::vector<CacheManager::SlotEviction> twice = {{1, 1, 2}, {1, 1, 3}};
  EXPECT_EQ(c.evict_slots(0, twice).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(positions_of(c, 0, 1, 1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(c.num_free_pages(), free_before);

  const std::vector<CacheManager::SlotEviction> evictions = {{1, 1, 2}, {0, 0, 8}};  // (0, 0) drops its last slot
  const uint64_t epoch = c.table_epoch(0);
  const int32_t third_page = c.table(0)->pages(1, 1)[2];
  ASSERT_TRUE(c.evict_slots(0, evictions).is_ok());
  EXPECT_EQ(positions_of(c, 0, 1, 1), (std::vector<int32_t>{0, 1, 8, 3, 4, 5, 6, 7}));
  EXPECT_EQ(positions_of(c, 0, 0, 0), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(positions_of(c, 0, 0, 1).size(), 9u);
  // Both streams are down to two pages, their thirds kept as spares.
  EXPECT_EQ(c.table(0)->num_pages(1, 1), 2);
  EXPECT_EQ(c.table(0)->spare_page(1, 1), third_page);
  EXPECT_EQ(c.num_free_pages(), free_before);
  EXPECT_EQ(c.table_epoch(0), epoch);
  const int32_t stream = c.layout().stream(1, 1);
  for (int32_t t = 0; t < 8; ++t)
    for (int kv = 0; kv < 2; ++kv) {
      const PageSlot at = slot_of(1, 1, t);
      const int32_t token = t == 2 ? 8 : t;
      EXPECT_EQ(pool.element<float>(at.page_id, kv, at.offset)[head_dim - 1], 1000.0f * stream + 10.0f * token + kv)
          << "slot " << t;
    }
  // New tokens append after the refilled slots and keep their absolute positions.
  ASSERT_TRUE(c.reserve(0, 1).is_ok());
  EXPECT_EQ(positions_of(c, 0, 1, 1), (std::vector<int32_t>{0, 1, 8, 3, 4, 5, 6, 7, 9}));
  EXPECT_EQ(c.table(0)->pages(1, 1)[2], third_page);
  EXPECT_EQ(c.num_free_pages(), free_before);
  EXPECT_EQ(c.table_epoch(0), epoch);
  EXPECT_TRUE(c.check_integrity().is_ok());
}

}  // namespace
}  // namespace se
