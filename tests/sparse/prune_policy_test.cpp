// The policy-side pieces of prefix pruning: names, KVzip's scores reduced to one per position, and keep masks
// rounded up to whole pages with the next-best positions.
#include "sparse/prune/prune_policy.h"
#include "sparse/prune/kvzip_global_scorer.h"

#include <gtest/gtest.h>

namespace se {
namespace {

TEST(PrunePolicyTest, ParsesItsNames) {
  EXPECT_EQ(parse_prune_policy("snapkv_global"), PrunePolicy::kSnapKvGlobal);
  EXPECT_EQ(parse_prune_policy("kvzip_global"), PrunePolicy::kKvzipGlobal);
  EXPECT_FALSE(parse_prune_policy("snapkv").has_value());
  EXPECT_EQ(prune_policy_name(PrunePolicy::kKvzipGlobal), "kvzip_global");
}

TEST(PrunePolicyTest, KvzipScoresAreTheHeadMeanSummedOverLayers) {
  // [2 layers][2 KV heads][3 tokens]
  const std::vector<float> scores = {1, 2, 3, 3, 2, 1,   // layer 0
                                     0, 4, 0, 2, 0, 2};  // layer 1
  const std::vector<float> got = kvzip_position_scores(scores, 2, 2, 3);
  EXPECT_EQ(got, (std::vector<float>{2 + 1, 2 + 2, 2 + 1}));
}

TEST(PrunePolicyTest, KeptPositionsAreTheBestOfTheRangeThenTheLowestTies) {
  // Range [4, 12) (blocks [1, 3) of 4-token pages). Scores rank 9 > 5 > 11 > 6 > the rest (ties: lower).
  std::vector<float> scores(16, 0.0f);
  scores[9] = 5, scores[5] = 4, scores[11] = 3, scores[6] = 2;
  scores[0] = 100, scores[12] = 100;  // outside the range: never kept
  EXPECT_EQ(kept_positions(scores, {4, 12}, 4), (std::vector<int32_t>{5, 6, 9, 11}));
  // Two pages: the four best, then the lowest of the ties.
  EXPECT_EQ(kept_positions(scores, {4, 12}, 8), (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_TRUE(kept_positions(scores, {4, 12}, 0).empty());
}

}  // namespace
}  // namespace se
