#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/vector_math.h"

namespace se::cpu {

void attention(TensorView out, TensorView q, TensorView k, TensorView v, TensorView q_positions,
               TensorView k_positions, const AttentionParams& params) {
  const int64_t num_queries = q.shape[0];
  const int64_t num_heads = q.shape[1];
  const int64_t head_dim = q.shape[2];
  const int64_t num_keys = k.shape[0];
  const int64_t num_kv_heads = k.shape[1];
  const int64_t group = num_heads / num_kv_heads;
  const int32_t* qpos = q_positions.ptr<int32_t>();
  const int32_t* kpos = k_positions.ptr<int32_t>();

#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(num_keys));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t t = 0; t < num_queries; ++t) {
      for (int64_t h = 0; h < num_heads; ++h) {
        const float* qv = q.ptr<float>() + (t * num_heads + h) * head_dim;
        const int64_t kvh = h / group;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < num_keys; ++s) {
          const bool visible = kpos[s] <= qpos[t] &&
                               (params.sliding_window == 0 || qpos[t] - kpos[s] < params.sliding_window);
          if (!visible) {
            scores[static_cast<size_t>(s)] = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* kv = k.ptr<float>() + (s * num_kv_heads + kvh) * head_dim;
          float score = dot(qv, kv, static_cast<int32_t>(head_dim)) * params.scale;
          if (params.logit_softcap > 0.0f) score = params.logit_softcap * std::tanh(score / params.logit_softcap);
          scores[static_cast<size_t>(s)] = score;
          max_score = std::max(max_score, score);
        }
        float* o = out.ptr<float>() + (t * num_heads + h) * head_dim;
        std::fill(o, o + head_dim, 0.0f);
        if (max_score == -std::numeric_limits<float>::infinity()) continue;  // no visible key
        // The whole row's exponentials at once (vectorized; hidden keys become 0), then the weighted sum of V.
        const float denom = exp_shifted_sum(scores.data(), static_cast<int32_t>(num_keys), max_score);
        for (int64_t s = 0; s < num_keys; ++s) {
          const float p = scores[static_cast<size_t>(s)];
          if (p == 0.0f) continue;
          const float* vv = v.ptr<float>() + (s * num_kv_heads + kvh) * head_dim;
          axpy(p, vv, o, static_cast<int32_t>(head_dim));
        }
        const float inv = 1.0f / denom;
        for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
      }
    }
  }
}

}  // namespace se::cpu
