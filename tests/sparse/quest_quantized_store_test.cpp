// Quest over the quantized stores on the CPU: the page key bounds over FP8 pages and over KIVI's groups (its
// quantized groups from their codes, the window's from its rows) equal the bounds of the keys the store decodes to,
// and Quest's page scores, kept pages and attention over them equal Quest's over an explicit f32 cache that holds
// the decoded K/V in pages of the same tokens (page sizes 16 and 64, partial last pages, KIVI-2 and KIVI-4, a window
// holding a whole unflushed block).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <random>

#include "../support/kv_store_steps.h"
#include "backend/cpu/kivi_rows.h"
#include "backend/ops.h"
#include "backend/quant/fp8_kv.h"
#include "base/check.h"
#include "sparse/kivi_cache_manager.h"
#include "sparse/paged_cache_manager.h"

namespace se {
namespace {

constexpr int kHeads = 2, kQueryHeads = 4, kDim = 32;

Tensor zeros_f32(Shape shape) { return Tensor::zeros(DType::kF32, shape); }

// Sequence 0's `n` rows as one step: every slot of the view is new.
ForwardBatch one_step(int32_t n) {
  ForwardBatch batch;
  batch.sequences.push_back({0, 0, n});
  return batch;
}

// An f32 cache of one layer in pages of `page_size` tokens whose sequence 0 holds k, v [T, kHeads, kDim], and
// its page bounds.
struct ExplicitCache {
  std::unique_ptr<PagedCacheManager> cache;
  Tensor bounds;
};

ExplicitCache explicit_cache(int32_t page_size, const Tensor& k, const Tensor& v) {
  const KvLayout layout{1, kHeads, kDim, page_size, DType::kF32, KvStoreKind::kExplicit};
  auto made = PagedCacheManager::create(layout, 256, cpu_allocator(), false);
  SE_CHECK(made.is_ok(), "{}", made.status().to_string());
  ExplicitCache e{std::move(*made), zeros_f32(Shape{256, 2, kDim})};
  const auto n = static_cast<int32_t>(k.shape()[0]);
  SE_CHECK(e.cache->open(0, {}).is_ok() && e.cache->reserve(0, n).is_ok(), "explicit cache");
  test::write_step(*e.cache, 0, n, k, v);
  update_page_key_bounds(e.bounds.view(), e.cache->build_view(0, one_step(n)), n);
  return e;
}

// Quest over `store` (its bounds in store_bounds) against Quest over `reference`, an explicit cache of the K/V the
// store decodes to (its bounds in reference_bounds), for one decode row of sequence 0 keeping `page_budget` pages.
void expect_quest_agrees(AttentionView store, TensorView store_bounds, AttentionView reference,
                         TensorView reference_bounds, int32_t page_budget, std::mt19937& rng) {
  const int32_t one_row[2] = {0, 1};
  store.q_indptr = reference.q_indptr = one_row;
  const int32_t unit = selection_page_tokens(store);
  ASSERT_EQ(unit, selection_page_tokens(reference));
  int32_t num_pages = 0;
  for (int h = 0; h < kHeads; ++h) {
    ASSERT_EQ(store.seqs[0].num_tokens[h], reference.seqs[0].num_tokens[h]);
    num_pages = std::max(num_pages, (store.seqs[0].num_tokens[h] + unit - 1) / unit);
  }
  ASSERT_GT(num_pages, page_budget) << "the ranking must drop pages";

  // Every page's bounds, read through the scores of unit queries: e_d scores a page's maximum of channel d, -e_d
  // minus its minimum.
  Tensor unit_q = zeros_f32(Shape{kQueryHeads, kDim});
  Tensor got = zeros_f32(Shape{kQueryHeads, num_pages}), want = zeros_f32(Shape{kQueryHeads, num_pages});
  for (int d = 0; d < kDim; ++d)
    for (const float sign : {1.0f, -1.0f}) {
      for (int h = 0; h < kQueryHeads; ++h) {
        std::fill_n(unit_q.data<float>() + h * kDim, kDim, 0.0f);
        unit_q.data<float>()[h * kDim + d] = sign;
      }
      page_key_bound_scores(got.view(), unit_q.view(), store_bounds, store, 0);
      page_key_bound_scores(want.view(), unit_q.view(), reference_bounds, reference, 0);
      for (int64_t i = 0; i < got.numel(); ++i)
        ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << "channel " << d << " sign " << sign << " at " << i;
    }

  // The kept pages of a random query, then attention over them.
  Tensor q = Tensor::empty(DType::kF32, Shape{1, kQueryHeads, kDim}, cpu_allocator());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = normal(rng);
  const auto rank = [&](const AttentionView& view, TensorView bounds, Tensor& lists, Tensor& counts) {
    lists = Tensor::empty(DType::kI32, Shape{1, kHeads, page_budget}, cpu_allocator());
    counts = Tensor::empty(DType::kI32, Shape{1, kHeads}, cpu_allocator());
    select_pages_by_key_bounds(lists.view(), counts.view(), q.view(), bounds, view, page_budget, num_pages,
                               GroupReduce::kMean);
  };
  Tensor store_lists, store_counts, reference_lists, reference_counts;
  rank(store, store_bounds, store_lists, store_counts);
  rank(reference, reference_bounds, reference_lists, reference_counts);
  for (int h = 0; h < kHeads; ++h) {
    ASSERT_EQ(store_counts.data<int32_t>()[h], page_budget) << h;
    ASSERT_EQ(reference_counts.data<int32_t>()[h], page_budget) << h;
    for (int32_t i = 0; i < page_budget; ++i)
      EXPECT_EQ(store_lists.data<int32_t>()[h * page_budget + i], reference_lists.data<int32_t>()[h * page_budget + i])
          << "head " << h << " entry " << i;
  }
  // Attention of q over the view, narrowed to the lists when given.
  const auto attend = [&](AttentionView view, const Tensor* lists, const Tensor* counts) {
    SeqKvView selected = view.seqs[0];
    if (lists != nullptr) {
      selected.selected = lists->data<int32_t>();
      selected.selected_stride = page_budget;
      selected.num_selected = counts->data<int32_t>();
      view.seqs = &selected;
      view.selection_unit = SelectionUnit::kPage;
      view.has_selection = true;
    }
    Tensor out = zeros_f32(Shape{1, kQueryHeads, kDim});
    paged_attention(out.view(), q.view(), view, AttentionParams{1.0f / std::sqrt(float{kDim})});
    return out;
  };
  const Tensor selected = attend(store, &store_lists, &store_counts);
  const Tensor expected = attend(reference, &reference_lists, &reference_counts);
  const Tensor dense = attend(reference, nullptr, nullptr);
  double moved = 0.0;
  for (int64_t i = 0; i < selected.numel(); ++i) {
    EXPECT_NEAR(selected.data<float>()[i], expected.data<float>()[i], 1e-5f) << i;
    moved += std::fabs(expected.data<float>()[i] - dense.data<float>()[i]);
  }
  EXPECT_GT(moved, 0.0) << "the selection read every key";
}

class QuestOverFp8Test : public ::testing::TestWithParam<int32_t> {};

TEST_P(QuestOverFp8Test, BoundsRankingAndAttentionAreThoseOfTheDecodedKeys) {
  const int32_t page_size = GetParam();
  constexpr int32_t kTokens = 150;  // a partial last page at 16 and at 64
  const KvLayout layout{
      1, kHeads, kDim, page_size, kv_page_dtype(Device::kCpu, KvStoreKind::kFp8E4M3), KvStoreKind::kFp8E4M3};
  auto made = PagedCacheManager::create(layout, 64, cpu_allocator(), false);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  PagedCacheManager& fp8 = **made;
  std::mt19937 rng(static_cast<uint32_t>(page_size));
  const Tensor k = test::random_kv_rows(rng, kTokens, kHeads, kDim),
               v = test::random_kv_rows(rng, kTokens, kHeads, kDim);
  ASSERT_TRUE(fp8.open(0, {}).is_ok() && fp8.reserve(0, kTokens).is_ok());
  test::write_step(fp8, 0, kTokens, k, v);
  Tensor bounds = zeros_f32(Shape{64, 2, kDim});
  const AttentionView view = fp8.build_view(0, one_step(kTokens));
  update_page_key_bounds(bounds.view(), view, kTokens);

  Tensor decoded_k = Tensor::empty(DType::kF32, k.shape(), cpu_allocator());
  Tensor decoded_v = Tensor::empty(DType::kF32, v.shape(), cpu_allocator());
  for (int32_t t = 0; t < kTokens; ++t)
    for (int h = 0; h < kHeads; ++h) {
      const PageSlot at = fp8.table(0)->slot(0, h, t);
      const int64_t row = (int64_t{t} * kHeads + h) * kDim;
      fp8_dequantize(view.element<uint8_t>(at.page_id, 0, at.offset), kDim, view.quantized.k_scales[h],
                     Fp8Format::kE4M3, decoded_k.data<float>() + row);
      fp8_dequantize(view.element<uint8_t>(at.page_id, 1, at.offset), kDim, view.quantized.v_scales[h],
                     Fp8Format::kE4M3, decoded_v.data<float>() + row);
    }
  ExplicitCache reference = explicit_cache(page_size, decoded_k, decoded_v);
  expect_quest_agrees(fp8.build_sequence_view(0, 0), bounds.view(), reference.cache->build_sequence_view(0, 0),
                      reference.bounds.view(), page_size == 16 ? 4 : 2, rng);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, QuestOverFp8Test, ::testing::Values(16, 64));

struct KiviCase {
  KvStoreKind store;
  int32_t group, residual;
  int32_t prompt, decode_steps;  // flushed steps: a prompt, then one token at a time
  int32_t page_budget;
};

void PrintTo(const KiviCase& c, std::ostream* os) {
  *os << kv_store_kind_name(c.store) << ", group " << c.group << ", R " << c.residual << ", " << c.prompt
      << "-token prompt + " << c.decode_steps << " + 1 decode steps, budget " << c.page_budget << " pages";
}

class QuestOverKiviTest : public ::testing::TestWithParam<KiviCase> {};

// The store is written as KIVI runs (each step flushed), then one more decode token is written and not flushed, as
// Quest sees the cache during a step. The groups are bounded as Quest bounds them: after every step, those quantized
// since the last.
TEST_P(QuestOverKiviTest, BoundsRankingAndAttentionAreThoseOfTheDecodedKeys) {
  const KiviCase c = GetParam();
  const int32_t len = c.prompt + c.decode_steps + 1;
  const KvLayout layout = make_kv_layout(1, kHeads, kDim, 16, Device::kCpu, c.store, c.group, c.residual, c.prompt);
  auto made = KiviCacheManager::create(layout, 1024, cpu_allocator());
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  KiviCacheManager& kivi = **made;
  std::mt19937 rng(static_cast<uint32_t>(c.group + c.prompt));
  const Tensor k = test::random_kv_rows(rng, len, kHeads, kDim), v = test::random_kv_rows(rng, len, kHeads, kDim, 2.0f);
  Tensor bounds = zeros_f32(Shape{1024, 2, kDim});
  std::vector<int32_t> bounded(kHeads, 0);
  ASSERT_TRUE(kivi.open(0, {}).is_ok());
  int32_t written = 0;
  const auto step = [&](int32_t n, bool flush) {
    ASSERT_TRUE(kivi.reserve(0, n).is_ok());
    const AttentionView view = kivi.build_view(0, one_step(n));
    const int64_t row_elements = int64_t{kHeads} * kDim;
    const TensorView rows_k{const_cast<float*>(k.data<float>()) + written * row_elements, DType::kF32,
                            Shape{n, kHeads, kDim}, Device::kCpu};
    const TensorView rows_v{const_cast<float*>(v.data<float>()) + written * row_elements, DType::kF32,
                            Shape{n, kHeads, kDim}, Device::kCpu};
    kivi.write(0, view, rows_k, rows_v);
    update_key_group_bounds(bounds.view(), view, bounded);
    for (int h = 0; h < kHeads; ++h)
      bounded[static_cast<size_t>(h)] = view.quantized.kivi_seqs[0].num_quantized_keys[h] / c.group;
    written += n;
    if (flush) kivi.on_computed(0, {}, written);
  };
  step(c.prompt, true);
  for (int32_t i = 0; i < c.decode_steps; ++i) step(1, true);
  step(1, false);

  const AttentionView view = kivi.build_sequence_view(0, 0);
  const QuantizedKvView& qv = view.quantized;
  EXPECT_GT(qv.kivi_seqs[0].num_quantized_keys[0], 0) << "no quantized group";
  // The K/V every CPU op reads from the store (kivi_rows.h; kivi_kv_store_test checks them against KIVI's quantizer).
  const KiviPageLayout page_layout = kivi_page_layout(qv.group_size, qv.value_group_size, kDim, qv.bits);
  Tensor decoded_k = Tensor::empty(DType::kF32, k.shape(), cpu_allocator());
  Tensor decoded_v = Tensor::empty(DType::kF32, v.shape(), cpu_allocator());
  std::vector<float> local(kDim);
  for (int h = 0; h < kHeads; ++h) {
    const cpu::KiviRows rows = cpu::KiviRows::of(view, page_layout, 0, h);
    for (int32_t t = 0; t < len; ++t) {
      const int64_t row = (int64_t{t} * kHeads + h) * kDim;
      std::copy_n(rows.key(t, local.data()), kDim, decoded_k.data<float>() + row);
      std::copy_n(rows.value(t, local.data()), kDim, decoded_v.data<float>() + row);
    }
  }
  ExplicitCache reference = explicit_cache(c.group, decoded_k, decoded_v);
  expect_quest_agrees(view, bounds.view(), reference.cache->build_sequence_view(0, 0), reference.bounds.view(),
                      c.page_budget, rng);
}

INSTANTIATE_TEST_SUITE_P(
    GroupsAndWindows, QuestOverKiviTest,
    ::testing::Values(
        // Groups of 16: 64 keys quantized, a window of 14 keys (a partial last page).
        KiviCase{KvStoreKind::kKivi2, 16, 32, 50, 27, 3}, KiviCase{KvStoreKind::kKivi4, 16, 32, 50, 27, 3},
        // The window holds a whole block of R keys the step has not flushed yet: two full pages of window keys.
        KiviCase{KvStoreKind::kKivi2, 16, 32, 70, 25, 3},
        // Groups of 64: 128 keys quantized, a window of 23 keys.
        KiviCase{KvStoreKind::kKivi2, 64, 64, 100, 50, 2}, KiviCase{KvStoreKind::kKivi4, 64, 64, 100, 50, 2}));

}  // namespace
}  // namespace se
