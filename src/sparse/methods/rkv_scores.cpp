#include "sparse/methods/rkv_scores.h"

#include <algorithm>

#include "backend/ops.h"
#include "base/top_k.h"
#include "sparse/methods/observation_window_scores.h"

namespace se {

RkvScores rkv_scores(const float* queries, const float* keys, int32_t num_tokens, int32_t num_heads,
                     int32_t num_kv_heads, int32_t head_dim, const RkvParams& params) {
  const int32_t w = params.window, n = num_tokens - w;
  RkvScores s{num_kv_heads, n, std::vector<float>(static_cast<size_t>(num_kv_heads) * n)};
  // Steps 1-2 and 3 as the backend ops (their CPU twins; the keys' first n rows are the scored ones).
  std::vector<float> importance(static_cast<size_t>(num_kv_heads) * n),
      redundancy(static_cast<size_t>(num_kv_heads) * num_tokens);
  auto* q = const_cast<float*>(queries);  // TensorView holds a mutable pointer; the ops only read q and keys
  auto* k = const_cast<float*>(keys);
  group_max_attention_importance(TensorView{importance.data(), DType::kF32, {num_kv_heads, n}, Device::kCpu},
                                 TensorView{q, DType::kF32, {w, num_heads, head_dim}, Device::kCpu},
                                 TensorView{k, DType::kF32, {n, num_kv_heads, head_dim}, Device::kCpu});
  key_redundancy(TensorView{redundancy.data(), DType::kF32, {num_kv_heads, num_tokens}, Device::kCpu},
                 TensorView{k, DType::kF32, {num_tokens, num_kv_heads, head_dim}, Device::kCpu},
                 params.similarity_threshold);
  std::vector<float> pooled(static_cast<size_t>(n));
  for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    pool_scores(importance.data() + static_cast<size_t>(kvh) * n, pooled.data(), n, params.kernel, WindowPooling::kMax);
    const float* red = redundancy.data() + static_cast<size_t>(kvh) * num_tokens;
    float* out = s.values.data() + static_cast<size_t>(kvh) * n;
    for (int32_t j = 0; j < n; ++j) out[j] = params.mix_lambda * pooled[j] - (1.0f - params.mix_lambda) * red[j];
  }
  return s;
}

std::vector<std::vector<int32_t>> rkv_select(const float* queries, const float* keys, int32_t num_tokens,
                                             int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                                             const RkvParams& params) {
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(num_kv_heads));
  if (num_tokens <= params.budget) {
    for (auto& k : kept) {
      k.resize(static_cast<size_t>(num_tokens));
      for (int32_t t = 0; t < num_tokens; ++t) k[t] = t;
    }
    return kept;
  }
  const RkvScores s = rkv_scores(queries, keys, num_tokens, num_heads, num_kv_heads, head_dim, params);
  for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh) {
    top_k_ascending(s.values.data() + static_cast<size_t>(kvh) * s.num_prefix, s.num_prefix,
                    params.budget - params.window, kept[kvh]);
    for (int32_t t = s.num_prefix; t < num_tokens; ++t) kept[kvh].push_back(t);
  }
  return kept;
}

bool rkv_should_compress(int64_t resident_tokens, int64_t num_decoded_tokens, int64_t num_new_tokens,
                         const RkvParams& params) {
  if (num_new_tokens <= 0 || num_decoded_tokens <= 0) return false;
  if (resident_tokens < params.budget + params.buffer) return false;
  const int64_t before = std::max<int64_t>(0, num_decoded_tokens - num_new_tokens);
  return num_decoded_tokens / params.buffer > before / params.buffer;
}

}  // namespace se
