#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/visible_keys.h"

namespace se::cpu {

void attention_scores(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                      const AttentionParams& params, ScoreReduce reduce) {
  const SeqKvView& sv = view.seqs[slice];
  const int32_t n = static_cast<int32_t>(q.shape[0]);
  const int64_t num_heads = q.shape[1];
  const int64_t group = num_heads / view.num_kv_heads;
  const int64_t max_len = out.shape[1];
  const int32_t head_dim = view.head_dim;
  const bool turboquant = is_turboquant_view(view);
  std::fill(out.ptr<float>(), out.ptr<float>() + out.numel(), 0.0f);

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t h = 0; h < num_heads; ++h) {
    const int32_t kvh = static_cast<int32_t>(h / group);
    float* dst = out.ptr<float>() + h * max_len;
    std::vector<int32_t> keys;
    std::vector<float> probs;
    std::vector<float> query_domain(turboquant ? static_cast<size_t>(turboquant_key_width(view)) : 0);
    for (int32_t r = 0; r < n; ++r) {
      const float* qv = q.ptr<float>() + (static_cast<int64_t>(r) * num_heads + h) * head_dim;
      if (turboquant) {
        turboquant_query(view, kvh, qv, query_domain.data());
        qv = query_domain.data();
      }
      const float max_score = visible_logits(view, slice, kvh, visible_range(sv, kvh, n, r, params.sliding_window), qv,
                                             params, keys, probs);
      float denom = 0.0f;
      for (float& p : probs) denom += (p = std::exp(p - max_score));
      for (size_t i = 0; i < keys.size(); ++i) {
        const float p = probs[i] / denom;
        float& o = dst[keys[i]];
        o = reduce == ScoreReduce::kSum ? o + p : std::max(o, p);
      }
    }
  }
}

}  // namespace se::cpu
