#include "cli/eval_stats.h"

#include <cmath>
#include <algorithm>

namespace se::cli {

namespace {
constexpr double kZ975 = 1.959963984540054;  // the standard normal's 97.5% quantile
}  // namespace

Interval wilson_interval(int64_t correct, int64_t total) {
  const double n = static_cast<double>(total);
  const double p = static_cast<double>(correct) / n;
  const double z2 = kZ975 * kZ975;
  const double center = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = kZ975 * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n);
  // At 0 and n the interval ends exactly at 0 and 1 (the formula gives them up to rounding).
  return {p, correct == 0 ? 0.0 : std::max(0.0, center - half), correct == total ? 1.0 : std::min(1.0, center + half)};
}

double student_t_975(int64_t dof) {
  if (dof == 1) return 12.706204736174707;
  if (dof == 2) return 4.302652729749464;
  if (dof == 3) return 3.182446305284263;
  if (dof == 4) return 2.776445105197799;
  // Cornish-Fisher expansion around the normal quantile; within 1e-3 of the exact value from 5 degrees up.
  const double z = kZ975, v = static_cast<double>(dof);
  const double z3 = z * z * z, z5 = z3 * z * z, z7 = z5 * z * z, z9 = z7 * z * z;
  return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v) +
         (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * v * v * v) +
         (79 * z9 + 776 * z7 + 1482 * z5 - 1920 * z3 - 945 * z) / (92160 * v * v * v * v);
}

Interval mean_interval(std::span<const double> values) {
  const double n = static_cast<double>(values.size());
  double sum = 0.0;
  for (double v : values) sum += v;
  const double mean = sum / n;
  if (values.size() < 2) return {mean, mean, mean};
  double ss = 0.0;
  for (double v : values) ss += (v - mean) * (v - mean);
  const double half = student_t_975(static_cast<int64_t>(values.size()) - 1) * std::sqrt(ss / (n - 1) / n);
  return {mean, mean - half, mean + half};
}

}  // namespace se::cli
