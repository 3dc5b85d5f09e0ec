// Seeded, platform-independent standard normal draws (splitmix64 bits, Box-Muller in double) and the random
// matrices TurboQuant builds from them: a Haar-distributed rotation (QR of a Gaussian matrix with the signs of
// R's diagonal moved into Q, so the law is exactly Haar) and the Gaussian QJL projection. The same seed gives the
// same matrix on every machine and in every process. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace se {

// n i.i.d. N(0, 1) values of the stream `seed`.
std::vector<double> seeded_gaussians(uint64_t seed, int64_t n);

// [dim, dim] row-major: entry (i, j) is draw i * dim + j.
std::vector<double> gaussian_matrix(int32_t dim, uint64_t seed);

// [dim, dim] row-major orthogonal Q of the QR factorization of gaussian_matrix(dim, seed), with R's diagonal
// made positive (modified Gram-Schmidt over the columns, run twice so Q^T Q = I to rounding).
std::vector<double> haar_rotation(int32_t dim, uint64_t seed);

}  // namespace se
