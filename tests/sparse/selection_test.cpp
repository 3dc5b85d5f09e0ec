// Selection::apply: host lists become per-sequence views; produced lists of every sequence in one batch-wide
// layout are also described by the view's `produced` (what lets a device view carry them by value), and any
// departure from that layout leaves `produced` empty. The view also records the most query rows of a selected
// sequence, which lets a GPU launch run unselected prefill chunks densely.
#include "sparse/selection.h"

#include <gtest/gtest.h>

#include <vector>

namespace se {
namespace {

constexpr int32_t kSeqs = 3, kHeads = 2, kBudget = 4;

// A dense view of kSeqs sequences over host tables (only what apply reads).
struct DenseView {
  std::vector<int32_t> num_tokens = std::vector<int32_t>(kSeqs * kHeads, 64);
  std::vector<SeqKvView> seqs = std::vector<SeqKvView>(kSeqs);
  AttentionView view;
  DenseView() {
    for (int32_t s = 0; s < kSeqs; ++s) seqs[static_cast<size_t>(s)].num_tokens = num_tokens.data() + s * kHeads;
    view.num_seqs = kSeqs;
    view.num_kv_heads = kHeads;
    view.page_size = 16;
    view.seqs = seqs.data();
  }
};

TEST(SelectionTest, UniformProducedListsAreDescribedBatchWide) {
  DenseView dense;
  std::vector<int32_t> lists(kSeqs * kHeads * kBudget, 0), counts(kSeqs * kHeads, kBudget);
  Selection selection;
  selection.reset(kSeqs, kHeads, SelectionUnit::kPage);
  for (int32_t s = 0; s < kSeqs; ++s)
    selection.set_produced(s, lists.data() + s * kHeads * kBudget, kBudget, counts.data() + s * kHeads, 100);
  const AttentionView view = selection.apply(dense.view);
  EXPECT_TRUE(view.has_selection && view.selection_produced);
  EXPECT_EQ(view.produced.lists, lists.data());
  EXPECT_EQ(view.produced.seq_stride, kHeads * kBudget);
  EXPECT_EQ(view.produced.head_stride, kBudget);
  EXPECT_EQ(view.produced.counts, counts.data());
  EXPECT_EQ(view.seqs[2].selected, lists.data() + 2 * kHeads * kBudget);  // the per-sequence views agree
}

TEST(SelectionTest, ProducedListsOutsideOneLayoutStayPerSequence) {
  DenseView dense;
  std::vector<int32_t> lists(kSeqs * kHeads * kBudget * 2, 0), counts(kSeqs * kHeads * 2, kBudget);
  Selection selection;  // outlives each view apply returns: a view points into it
  const auto apply = [&](auto&& set_all) {
    selection.reset(kSeqs, kHeads, SelectionUnit::kPage);
    set_all(selection);
    return selection.apply(dense.view);
  };
  // One sequence left unselected (a prefill sequence of a mixed batch).
  AttentionView view = apply([&](Selection& sel) {
    for (int32_t s = 0; s < kSeqs - 1; ++s)
      sel.set_produced(s, lists.data() + s * kHeads * kBudget, kBudget, counts.data() + s * kHeads, 1);
  });
  EXPECT_TRUE(view.selection_produced);
  EXPECT_EQ(view.produced.lists, nullptr);
  EXPECT_EQ(view.seqs[kSeqs - 1].selected, nullptr);
  // Sequence strides that differ.
  view = apply([&](Selection& sel) {
    for (int32_t s = 0; s < kSeqs; ++s)
      sel.set_produced(s, lists.data() + s * s * kHeads * kBudget, kBudget, counts.data() + s * kHeads, 1);
  });
  EXPECT_EQ(view.produced.lists, nullptr);
  // Counts not packed per sequence.
  view = apply([&](Selection& sel) {
    for (int32_t s = 0; s < kSeqs; ++s)
      sel.set_produced(s, lists.data() + s * kHeads * kBudget, kBudget, counts.data() + 2 * s * kHeads, 1);
  });
  EXPECT_EQ(view.produced.lists, nullptr);
}

TEST(SelectionTest, EmptyHostListsSelectNothing) {
  DenseView dense;
  Selection selection;
  selection.reset(kSeqs, kHeads, SelectionUnit::kToken);
  for (int32_t h = 0; h < kHeads; ++h) selection.set(1, h, {});
  const AttentionView view = selection.apply(dense.view);
  // A null list would mean every token: the empty lists must be real ones.
  EXPECT_NE(view.seqs[1].selected, nullptr);
  EXPECT_EQ(view.seqs[1].num_selected[0], 0);
  EXPECT_EQ(view.seqs[0].selected, nullptr);  // unselected: every token
}

TEST(SelectionTest, ViewRecordsTheMostQueryRowsOfASelectedSequence) {
  DenseView dense;
  const std::vector<int32_t> q_indptr = {0, 1, 301, 302};  // decode, a 300-row prefill chunk, decode
  std::vector<int32_t> lists(kSeqs * kHeads * kBudget, 0), counts(kSeqs * kHeads, kBudget);
  const auto apply = [&](std::vector<int32_t> selected_seqs) {
    Selection selection;
    selection.reset(kSeqs, kHeads, SelectionUnit::kPage);
    for (int32_t s : selected_seqs)
      selection.set_produced(s, lists.data() + s * kHeads * kBudget, kBudget, counts.data() + s * kHeads, 1);
    return selection.apply(dense.view);
  };
  EXPECT_EQ(apply({0, 2}).selected_rows_max, -1);  // without row counts nothing is known
  dense.view.q_indptr = q_indptr.data();
  EXPECT_EQ(apply({0, 2}).selected_rows_max, 1);  // the prefill chunk beside them may run densely
  EXPECT_EQ(apply({0, 1, 2}).selected_rows_max, 300);
}

}  // namespace
}  // namespace se
