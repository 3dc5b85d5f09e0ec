// R-KV's final scores (ops.h: redundancy_aware_scores): the max-pooled attention importance minus the
// key-similarity redundancy, in float, as the reference mixes them. One KV head per OpenMP task.
#include <algorithm>
#include <limits>

#include "backend/cpu/cpu_ops.h"

namespace se::cpu {

void redundancy_aware_scores(TensorView out, TensorView importance, TensorView redundancy, int32_t kernel,
                             float lambda) {
  const int64_t num_kv_heads = out.shape[0], m = out.shape[1], num_tokens = redundancy.shape[1];
  const int64_t pad = kernel / 2;
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < num_kv_heads; ++h) {
    const float* in = importance.ptr<float>() + h * m;
    const float* red = redundancy.ptr<float>() + h * num_tokens;
    float* o = out.ptr<float>() + h * m;
    for (int64_t j = 0; j < m; ++j) {
      float pooled = -std::numeric_limits<float>::infinity();
      for (int64_t i = std::max<int64_t>(0, j - pad); i <= std::min(m - 1, j + pad); ++i)
        pooled = std::max(pooled, in[i]);
      o[j] = lambda * pooled - (1.0f - lambda) * red[j];
    }
  }
}

}  // namespace se::cpu
