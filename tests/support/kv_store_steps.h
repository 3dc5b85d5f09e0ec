// What the KV store tests write into a PagedCacheManager: random K/V rows and one sequence's step of them.
#pragma once

#include <random>

#include "model/forward_batch.h"
#include "sparse/paged_cache_manager.h"
#include "tensor/tensor.h"

namespace se::test {

// [rows, heads, dim] F32 rows drawn from N(0, amplitude^2).
inline Tensor random_kv_rows(std::mt19937& rng, int64_t rows, int64_t heads, int64_t dim, float amplitude = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, Shape{rows, heads, dim}, cpu_allocator());
  std::normal_distribution<float> normal(0.0f, amplitude);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

// One sequence (id 0) gets `n` new rows in layer `layer`: reserve must have been called for the step.
inline void write_step(PagedCacheManager& cache, int layer, int32_t n, const Tensor& k, const Tensor& v) {
  ForwardBatch batch;
  batch.sequences.push_back({0, 0, n});
  cache.write(layer, cache.build_view(layer, batch), k.view(), v.view());
}

}  // namespace se::test
