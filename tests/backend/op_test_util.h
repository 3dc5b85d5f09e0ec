// Helpers for op tests: seeded random tensors and a relative-error measure (||a - b|| / ||b||).
#pragma once

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/attention_view.h"
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

// An f32 page pool whose element i holds i, so every K/V row read or moved says where it came from. The view
// describes the pool only (no sequences); a test adds those it needs.
template <int32_t kNumPages, int32_t kPageSize, int32_t kHeadDim>
struct NumberedPool {
  std::vector<float> data = std::vector<float>(size_t{kNumPages} * 2 * kPageSize * kHeadDim);
  NumberedPool() { std::iota(data.begin(), data.end(), 0.0f); }
  AttentionView view() {
    AttentionView v;
    v.kv_base = data.data();
    v.kv_dtype = DType::kF32;
    v.page_bytes = sizeof(float) * 2 * kPageSize * kHeadDim;
    v.page_size = kPageSize;
    v.head_dim = kHeadDim;
    return v;
  }
};

}  // namespace se::test
