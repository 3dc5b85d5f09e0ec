// The KV budget's split between the page pool and the method's per-sequence state: every running sequence's
// state and the pages of one longest request fit in the budget, fewer sequences run when it holds fewer, and a
// budget that holds none is a clear error.
#include "engine/kv_budget.h"

#include <gtest/gtest.h>

namespace se {
namespace {

// Pages of 100 bytes; one request of max_model_len holds 50 of them (5,000 bytes).
KvBudget budget(int64_t budget_bytes, int64_t sequence_bytes, int max_num_seqs) {
  return KvBudget{budget_bytes, 100, sequence_bytes, 50, 200, max_num_seqs};
}

TEST(KvBudgetTest, AMethodWithoutSequenceStateGetsEveryByteAsPages) {
  const auto split = split_kv_budget(budget(10'050, 0, 64), "vanilla");
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  EXPECT_EQ(split->num_pages, 100);
  EXPECT_EQ(split->max_num_seqs, 64);
}

TEST(KvBudgetTest, EverySequenceThatMayRunHasItsStateOutOfTheBudget) {
  // 8 sequences of 1,000 bytes leave 12,000 bytes: 120 pages, more than one request's 50.
  const auto split = split_kv_budget(budget(20'000, 1'000, 8), "kara");
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  EXPECT_EQ(split->max_num_seqs, 8);
  EXPECT_EQ(split->num_pages, 120);
}

TEST(KvBudgetTest, ABudgetThatHoldsFewerSequencesRunsFewer) {
  // Beside one request's 5,000 bytes, 6,999 bytes hold the state of 6 sequences, not 64.
  const auto split = split_kv_budget(budget(11'999, 1'000, 64), "kara");
  ASSERT_TRUE(split.is_ok()) << split.status().to_string();
  EXPECT_EQ(split->max_num_seqs, 6);
  EXPECT_EQ(split->num_pages, 59);
  EXPECT_GE(split->num_pages, 50);
  // Exactly one fits.
  const auto one = split_kv_budget(budget(6'000, 1'000, 64), "kara");
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  EXPECT_EQ(one->max_num_seqs, 1);
  EXPECT_EQ(one->num_pages, 50);
}

TEST(KvBudgetTest, ABudgetThatHoldsNoSequenceBesideOneRequestIsAnError) {
  for (const int64_t bytes : {int64_t{0}, int64_t{4'000}, int64_t{5'999}}) {
    const auto split = split_kv_budget(budget(bytes, 1'000, 4), "kara");
    ASSERT_FALSE(split.is_ok()) << bytes;
    EXPECT_EQ(split.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(split.status().message().find("kara keeps per running sequence"), std::string::npos)
        << split.status().message();
    EXPECT_NE(split.status().message().find("--max-model-len 200"), std::string::npos) << split.status().message();
  }
}

}  // namespace
}  // namespace se
