// The thin singular value decomposition of a row-major matrix, in double: what low-rank weight factors and key
// sketches are built from. Plain function on host buffers; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace se {

// A [rows, cols] = U diag(sigma) Vt with k = min(rows, cols) singular values, descending.
struct ThinSvd {
  int32_t k = 0;
  std::vector<double> u;      // [rows, k] row-major
  std::vector<double> sigma;  // [k]
  std::vector<double> vt;     // [k, cols] row-major
};

// LAPACK's divide-and-conquer SVD (dgesdd, from the OpenBLAS the backend links) of `a` [rows, cols] row-major.
ThinSvd thin_svd(std::span<const double> a, int32_t rows, int32_t cols);

}  // namespace se
