// Helpers for op tests: seeded random tensors and a relative-error measure (||a - b|| / ||b||).
#pragma once

#include <cmath>
#include <random>

#include "tensor/tensor.h"

namespace se::test {

inline Tensor random_tensor(Shape shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

inline double relative_error(const float* a, const double* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den + 1e-30));
}

}  // namespace se::test
