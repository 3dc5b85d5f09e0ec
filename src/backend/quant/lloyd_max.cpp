#include "backend/quant/lloyd_max.h"

#include <cmath>

#include "base/check.h"

namespace se {
namespace {

constexpr int kTrapezoidPoints = 200;

// Integrals of pdf(x) and x * pdf(x) over [a, b] by the trapezoid rule.
void cell_moments(double a, double b, double sigma2, double& mass, double& first) {
  const double norm = 1.0 / std::sqrt(2.0 * M_PI * sigma2);
  const double step = (b - a) / (kTrapezoidPoints - 1);
  mass = 0.0;
  first = 0.0;
  double x_prev = a, p_prev = norm * std::exp(-a * a / (2.0 * sigma2));
  for (int i = 1; i < kTrapezoidPoints; ++i) {
    const double x = i == kTrapezoidPoints - 1 ? b : a + i * step;
    const double p = norm * std::exp(-x * x / (2.0 * sigma2));
    mass += 0.5 * (p + p_prev) * (x - x_prev);
    first += 0.5 * (x * p + x_prev * p_prev) * (x - x_prev);
    x_prev = x;
    p_prev = p;
  }
}

std::vector<double> midpoints(const std::vector<double>& c) {
  std::vector<double> m(c.size() - 1);
  for (size_t i = 0; i + 1 < c.size(); ++i) m[i] = (c[i] + c[i + 1]) / 2.0;
  return m;
}

}  // namespace

LloydMaxCodebook solve_lloyd_max(int32_t dim, int32_t bits, int32_t max_iter, double tol) {
  SE_CHECK(dim > 0 && bits >= 1 && bits <= 8, "Lloyd-Max codebook for d={} at {} bits", dim, bits);
  const int n = 1 << bits;
  const double sigma2 = 1.0 / dim, sigma = std::sqrt(sigma2);
  const double lo = -3.5 * sigma, hi = 3.5 * sigma;
  std::vector<double> c(n);
  for (int i = 0; i < n; ++i) c[i] = lo + (hi - lo) * (i + 0.5) / n;
  for (int iter = 0; iter < max_iter; ++iter) {
    std::vector<double> edges{lo * 3.0};
    for (double m : midpoints(c)) edges.push_back(m);
    edges.push_back(hi * 3.0);
    std::vector<double> next(n);
    double moved = 0.0;
    for (int i = 0; i < n; ++i) {
      double mass, first;
      cell_moments(edges[i], edges[i + 1], sigma2, mass, first);
      next[i] = mass > 1e-15 ? first / mass : c[i];
      moved = std::fmax(moved, std::fabs(next[i] - c[i]));
    }
    if (moved < tol) break;
    c = std::move(next);
  }
  // The law is symmetric; rounding is not. Mirroring the result makes c[n-1-i] = -c[i] exactly, so the middle
  // boundary is exactly 0 and a zero coordinate always lands in the same cell.
  std::vector<double> mirrored(n);
  for (int i = 0; i < n; ++i) mirrored[i] = (c[i] - c[n - 1 - i]) / 2.0;
  return {mirrored, midpoints(mirrored)};
}

}  // namespace se
