// 95% confidence intervals for `sparse-engine eval`: Wilson's score interval for a task's accuracy (k correct of
// n samples) and Student's t interval for a mean over windows (agreement, KL). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>

namespace se::cli {

struct Interval {
  double estimate = 0.0;
  double low = 0.0;
  double high = 0.0;
};

// Wilson score interval at 95% for `correct` of `total` (total > 0).
Interval wilson_interval(int64_t correct, int64_t total);

// The two-sided 95% quantile of Student's t with `dof` >= 1 degrees of freedom.
double student_t_975(int64_t dof);

// Mean of `values` with its 95% t interval (a single value has a zero-width interval).
Interval mean_interval(std::span<const double> values);

}  // namespace se::cli
