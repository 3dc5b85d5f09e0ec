// CUDA twin of redundancy_aware_scores (the CPU reference is backend/cpu/redundancy_aware_scores.cpp): one thread
// per (KV head, token) max-pools its importance window and subtracts the weighted redundancy, in float.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"

namespace se::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    redundancy_aware_scores_kernel(float* out, const float* importance, const float* redundancy, int num_kv_heads,
                                   int m, int num_tokens, int pad, float lambda) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= static_cast<int64_t>(num_kv_heads) * m) return;
  const int h = static_cast<int>(index / m), j = static_cast<int>(index % m);
  const float* in = importance + static_cast<int64_t>(h) * m;
  float pooled = -INFINITY;
  for (int i = max(0, j - pad); i <= min(m - 1, j + pad); ++i) pooled = fmaxf(pooled, in[i]);
  out[index] = lambda * pooled - (1.0f - lambda) * redundancy[static_cast<int64_t>(h) * num_tokens + j];
}

}  // namespace

void redundancy_aware_scores(TensorView out, TensorView importance, TensorView redundancy, int32_t kernel,
                             float lambda) {
  const auto num_kv_heads = static_cast<int>(out.shape[0]), m = static_cast<int>(out.shape[1]);
  const int64_t cells = int64_t{num_kv_heads} * m;
  redundancy_aware_scores_kernel<<<static_cast<unsigned>((cells + kThreads - 1) / kThreads), kThreads, 0,
                                   CudaContext::current().stream()>>>(
      out.ptr<float>(), importance.ptr<float>(), redundancy.ptr<float>(), num_kv_heads, m,
      static_cast<int>(redundancy.shape[1]), kernel / 2, lambda);
  SE_CUDA_CHECK_LAUNCH("redundancy_aware_scores_kernel");
}

}  // namespace se::cuda
