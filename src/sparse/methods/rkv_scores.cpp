#include "sparse/methods/rkv_scores.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "backend/ops.h"
#include "base/check.h"
#include "base/top_k.h"

namespace se {

void rkv_score(TensorView out, TensorView queries, TensorView keys, const RkvParams& params, RkvScratch& scratch) {
  const int64_t num_tokens = keys.shape[0], num_kv_heads = keys.shape[1];
  const int64_t n = num_tokens - params.window;
  SE_CHECK(queries.shape[0] == params.window && n > 0, "rkv: {} queries and {} keys for a window of {}",
           queries.shape[0], num_tokens, params.window);
  const TensorView importance = scratch_view(scratch.importance, out.device, DType::kF32, {num_kv_heads, n});
  const TensorView redundancy = scratch_view(scratch.redundancy, out.device, DType::kF32, {num_kv_heads, num_tokens});
  // Only the n older keys are normalized over; the redundancy sees all T.
  group_max_attention_importance(importance, queries,
                                 TensorView{keys.data, DType::kF32, {n, num_kv_heads, keys.shape[2]}, keys.device});
  // At lambda 1 the redundancy is weighted 0 (attention importance alone, SnapKV's score under R-KV's trigger):
  // zeros give the same scores without its O(T^2) similarities.
  if (params.mix_lambda == 1.0f) {
    fill_zero(redundancy);
  } else {
    key_redundancy(redundancy, keys, params.similarity_threshold);
  }
  redundancy_aware_scores(out, importance, redundancy, params.kernel, params.mix_lambda);
}

std::vector<int32_t> rkv_keep(const float* scores, int32_t num_tokens, const RkvParams& params) {
  std::vector<int32_t> kept;
  if (num_tokens <= params.budget) {
    kept.resize(static_cast<size_t>(num_tokens));
    for (int32_t t = 0; t < num_tokens; ++t) kept[static_cast<size_t>(t)] = t;
    return kept;
  }
  const int32_t n = num_tokens - params.window;
  top_k_ascending(scores, n, params.budget - params.window, kept);
  for (int32_t t = n; t < num_tokens; ++t) kept.push_back(t);
  return kept;
}

RkvScores rkv_scores(const float* queries, const float* keys, int32_t num_tokens, int32_t num_heads,
                     int32_t num_kv_heads, int32_t head_dim, const RkvParams& params) {
  const int32_t w = params.window, n = num_tokens - w;
  RkvScores s{num_kv_heads, n, std::vector<float>(static_cast<size_t>(num_kv_heads) * n)};
  RkvScratch scratch;
  // TensorView holds a mutable pointer; the ops only read queries and keys.
  rkv_score(TensorView{s.values.data(), DType::kF32, {num_kv_heads, n}, Device::kCpu},
            TensorView{const_cast<float*>(queries), DType::kF32, {w, num_heads, head_dim}, Device::kCpu},
            TensorView{const_cast<float*>(keys), DType::kF32, {num_tokens, num_kv_heads, head_dim}, Device::kCpu},
            params, scratch);
  return s;
}

std::vector<std::vector<int32_t>> rkv_select(const float* queries, const float* keys, int32_t num_tokens,
                                             int32_t num_heads, int32_t num_kv_heads, int32_t head_dim,
                                             const RkvParams& params) {
  if (num_tokens <= params.budget)
    return std::vector<std::vector<int32_t>>(static_cast<size_t>(num_kv_heads), rkv_keep(nullptr, num_tokens, params));
  const RkvScores s = rkv_scores(queries, keys, num_tokens, num_heads, num_kv_heads, head_dim, params);
  std::vector<std::vector<int32_t>> kept;
  kept.reserve(static_cast<size_t>(num_kv_heads));
  for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh)
    kept.push_back(rkv_keep(s.values.data() + static_cast<size_t>(kvh) * s.num_prefix, num_tokens, params));
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
