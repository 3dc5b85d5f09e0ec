// The decode-time compression scores' CPU twins on inputs small enough to work out by hand: the mask-free window
// scores average each query head's softmax, the group-max importance pools a group's logits before its softmax,
// key_redundancy clears each row's newest near-duplicate, redundancy_aware_scores max-pools the importance and
// subtracts the weighted redundancy; shapes that do not agree are refused. (Against the
// methods' numpy oracles on random inputs: tests/sparse/test_fidelity_rkv.py and test_fidelity_kara.py, through
// rkv_scores and kara_scores, which run these ops.)
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/ops.h"

namespace se {
namespace {

TensorView host(std::vector<float>& v, Shape shape) { return TensorView{v.data(), DType::kF32, shape, Device::kCpu}; }

// One query row, two query heads of one KV head, head_dim 4: head 0 sees logits {0, ln 3}, head 1 {0, -ln 3}.
struct TwoHeads {
  std::vector<float> q{2, 0, 0, 0, -2, 0, 0, 0};                                 // [1, 2, 4]; the logit is q . k / 2
  std::vector<float> k{0, 0, 0, 0, static_cast<float>(std::log(3.0)), 0, 0, 0};  // [2, 1, 4]
};

TEST(DecodeWindowScoresTest, BidirectionalScoresAverageTheHeadsSoftmaxes) {
  TwoHeads in;
  std::vector<float> out(2);
  bidirectional_window_scores(host(out, {1, 2}), host(in.q, {1, 2, 4}), host(in.k, {2, 1, 4}));
  // (0.25, 0.75) and (0.75, 0.25) averaged.
  EXPECT_NEAR(out[0], 0.5f, 1e-6f);
  EXPECT_NEAR(out[1], 0.5f, 1e-6f);
}

TEST(DecodeWindowScoresTest, GroupMaxPoolsTheLogitsBeforeTheSoftmax) {
  TwoHeads in;
  std::vector<float> out(2);
  group_max_attention_importance(host(out, {1, 2}), host(in.q, {1, 2, 4}), host(in.k, {2, 1, 4}));
  // max(0, 0) = 0 and max(ln 3, -ln 3) = ln 3: softmax (0.25, 0.75).
  EXPECT_NEAR(out[0], 0.25f, 1e-6f);
  EXPECT_NEAR(out[1], 0.75f, 1e-6f);
}

TEST(DecodeWindowScoresTest, KeyRedundancyClearsEachRowsNewestDuplicate) {
  // Keys 0, 1 and 3 point one way, key 2 another (and twice as long: only the direction counts).
  std::vector<float> k{1, 0, 1, 0, 0, 2, 1, 0};  // [4, 1, 2]
  std::vector<float> out(4);
  key_redundancy(host(out, {1, 4}), host(k, {4, 1, 2}), 0.5f);
  // Rows (S with the newest duplicate cleared): 0 -> (0, 1, 0, 0), 1 -> (1, 0, 0, 0), 2 -> 0, 3 -> (1, 0, 0, 0):
  // column means (0.5, 0.25, 0, 0), then their softmax.
  const double e[4] = {std::exp(0.5), std::exp(0.25), 1.0, 1.0};
  const double sum = e[0] + e[1] + e[2] + e[3];
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(out[static_cast<size_t>(j)], e[j] / sum, 1e-6) << j;
}

TEST(DecodeWindowScoresTest, RedundancyAwareScoresMaxPoolTheImportanceThenSubtractTheRedundancy) {
  // Two KV heads, m = 4 scored tokens of T = 5; kernel 3 pools each token with its neighbours (none past the ends).
  std::vector<float> importance{0.1f, 0.5f, 0.2f, 0.05f, 0.3f, 0.0f, 0.0f, 0.4f};
  std::vector<float> redundancy{0.2f, 0.1f, 0.3f, 0.2f, 0.2f, 0.0f, 0.4f, 0.2f, 0.2f, 0.2f};
  std::vector<float> out(8);
  redundancy_aware_scores(host(out, {2, 4}), host(importance, {2, 4}), host(redundancy, {2, 5}), 3, 0.25f);
  const float pooled[8] = {0.5f, 0.5f, 0.5f, 0.2f, 0.3f, 0.3f, 0.4f, 0.4f};
  const float red[8] = {0.2f, 0.1f, 0.3f, 0.2f, 0.0f, 0.4f, 0.2f, 0.2f};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(out[static_cast<size_t>(i)], 0.25f * pooled[i] - 0.75f * red[i], 1e-7f) << i;
}

TEST(DecodeWindowScoresDeathTest, RefusesShapesThatDoNotAgree) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TwoHeads in;
  std::vector<float> out(3);
  EXPECT_DEATH(bidirectional_window_scores(host(out, {1, 3}), host(in.q, {1, 2, 4}), host(in.k, {2, 1, 4})),
               "bidirectional_window_scores: out \\[1, 3\\] for keys \\[2, 1, 4\\]");
  EXPECT_DEATH(group_max_attention_importance(host(out, {1, 2}), host(in.q, {1, 3, 4}), host(in.k, {2, 2, 4})),
               "group_max_attention_importance: queries");
  EXPECT_DEATH(key_redundancy(host(out, {1, 3}), host(in.k, {2, 1, 4}), 0.5f), "key_redundancy: out");
  std::vector<float> scores(4);
  EXPECT_DEATH(redundancy_aware_scores(host(out, {1, 3}), host(scores, {1, 4}), host(scores, {1, 4}), 3, 0.1f),
               "redundancy_aware_scores: out \\[1, 3\\] for importance \\[1, 4\\]");
  EXPECT_DEATH(redundancy_aware_scores(host(out, {1, 3}), host(out, {1, 3}), host(scores, {1, 2}), 3, 0.1f),
               "redundancy_aware_scores: out");
  EXPECT_DEATH(redundancy_aware_scores(host(out, {1, 3}), host(out, {1, 3}), host(scores, {1, 4}), 2, 0.1f),
               "redundancy_aware_scores: kernel 2 must be odd");
}

}  // namespace
}  // namespace se
