// Helpers for op tests: seeded random tensors and a relative-error measure (||a - b|| / ||b||).
#pragma once

#include <algorithm>
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

// `random_tensor` with every element mapped through `round` (what a device keeps; identity on the CPU).
template <typename Round>
Tensor rounded_random_tensor(Shape shape, uint64_t seed, float scale, Round round) {
  Tensor t = random_tensor(shape, seed, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = round(t.data<float>()[i]);
  return t;
}

// One sequence of a random paged batch: new query rows over a stream of `len` stored tokens, the new ones included.
struct PagedSeq {
  int32_t rows;
  int32_t len;
};

// Page ids 0..num_pages-1 in a random order: a batch's pages scattered through the pool.
inline std::vector<int32_t> shuffled_page_ids(int32_t num_pages, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
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
