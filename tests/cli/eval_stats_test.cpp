// The confidence intervals of `sparse-engine eval` against published values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cli/eval_stats.h"

namespace se::cli {
namespace {

TEST(EvalStatsTest, WilsonMatchesReferenceValues) {
  // statsmodels proportion_confint(..., method="wilson").
  Interval a = wilson_interval(8, 10);
  EXPECT_NEAR(a.estimate, 0.8, 1e-12);
  EXPECT_NEAR(a.low, 0.4901624, 1e-6);
  EXPECT_NEAR(a.high, 0.9433178, 1e-6);
  Interval all = wilson_interval(50, 50);
  EXPECT_DOUBLE_EQ(all.high, 1.0);
  EXPECT_NEAR(all.low, 0.9286524, 1e-6);
  Interval none = wilson_interval(0, 50);
  EXPECT_DOUBLE_EQ(none.low, 0.0);
  EXPECT_NEAR(none.high, 0.0713476, 1e-6);
}

TEST(EvalStatsTest, StudentQuantiles) {
  // Tables of Student's t, two-sided 95%.
  EXPECT_NEAR(student_t_975(1), 12.706, 1e-3);
  EXPECT_NEAR(student_t_975(3), 3.182, 2e-3);
  EXPECT_NEAR(student_t_975(5), 2.571, 1e-3);
  EXPECT_NEAR(student_t_975(10), 2.228, 1e-3);
  EXPECT_NEAR(student_t_975(19), 2.093, 1e-3);
  EXPECT_NEAR(student_t_975(100), 1.984, 1e-3);
}

TEST(EvalStatsTest, MeanInterval) {
  const std::vector<double> v = {1.0, 2.0, 3.0, 4.0, 5.0};
  Interval m = mean_interval(v);
  EXPECT_DOUBLE_EQ(m.estimate, 3.0);
  // sd = sqrt(2.5), se = sqrt(0.5), t(4) = 2.776445
  EXPECT_NEAR(m.high - m.estimate, 2.776445 * std::sqrt(0.5), 2e-3);
  EXPECT_NEAR(m.estimate - m.low, m.high - m.estimate, 1e-12);
  const std::vector<double> one = {0.7};
  Interval single = mean_interval(one);
  EXPECT_DOUBLE_EQ(single.low, 0.7);
  EXPECT_DOUBLE_EQ(single.high, 0.7);
}

}  // namespace
}  // namespace se::cli
