#include "backend/quant/seeded_gaussian.h"

#include <cmath>

namespace se {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in (0, 1]: never 0, so the logarithm below is finite.
double unit_open_low(uint64_t& state) { return static_cast<double>((splitmix64(state) >> 11) + 1) * 0x1.0p-53; }

}  // namespace

std::vector<double> seeded_gaussians(uint64_t seed, int64_t n) {
  std::vector<double> out(n);
  uint64_t state = seed;
  for (int64_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(unit_open_low(state)));
    const double t = 2.0 * M_PI * unit_open_low(state);
    out[i] = r * std::cos(t);
    if (i + 1 < n) out[i + 1] = r * std::sin(t);
  }
  return out;
}

std::vector<double> gaussian_matrix(int32_t dim, uint64_t seed) {
  return seeded_gaussians(seed, static_cast<int64_t>(dim) * dim);
}

std::vector<double> haar_rotation(int32_t dim, uint64_t seed) {
  std::vector<double> q = gaussian_matrix(dim, seed);
  auto at = [&](int32_t i, int32_t j) -> double& { return q[static_cast<size_t>(i) * dim + j]; };
  for (int32_t j = 0; j < dim; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int32_t k = 0; k < j; ++k) {
        double dot = 0.0;
        for (int32_t i = 0; i < dim; ++i) dot += at(i, k) * at(i, j);
        for (int32_t i = 0; i < dim; ++i) at(i, j) -= dot * at(i, k);
      }
    }
    double norm = 0.0;
    for (int32_t i = 0; i < dim; ++i) norm += at(i, j) * at(i, j);
    norm = std::sqrt(norm);  // R's diagonal entry, positive: the sign fix is built in
    for (int32_t i = 0; i < dim; ++i) at(i, j) /= norm;
  }
  return q;
}

}  // namespace se
