// Lloyd-Max scalar codebook for one coordinate of a randomly rotated unit vector in dimension d, approximated by
// N(0, 1/d) (TurboQuant; solved as vLLM's turboquant/centroids.py does): 2^b centroids start uniform on
// +-3.5 sigma (cell centres), the outer cells end at +-10.5 sigma, and each iteration moves every centroid to its
// cell's conditional mean (a centroid whose cell holds no mass stays) until no centroid moves by tol or more, at
// most 200 iterations. The cell integrals use the trapezoid rule on 200 evenly spaced points per cell (vLLM calls
// scipy's adaptive quad; the trapezoid keeps the solver dependency-free and lands within 2e-3 sigma of it). The
// result is mirrored to be exactly symmetric.
// Pure function, thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace se {

struct LloydMaxCodebook {
  std::vector<double> centroids;   // [2^bits] ascending
  std::vector<double> boundaries;  // [2^bits - 1] midpoints of consecutive centroids
};

LloydMaxCodebook solve_lloyd_max(int32_t dim, int32_t bits, int32_t max_iter = 200, double tol = 1e-10);

}  // namespace se
