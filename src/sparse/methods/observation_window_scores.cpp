#include "sparse/methods/observation_window_scores.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace se {

Result<ObservationWindowConfig> read_observation_window_config(MethodConfig& reader, const std::string& method,
                                                               const ObservationWindowDefaults& defaults) {
  ObservationWindowConfig c;
  if (defaults.fractional_budget) {
    SE_ASSIGN_OR_RETURN(c.real_budget, reader.get_double("budget", defaults.budget, 2, 1 << 30));
    c.budget = static_cast<int32_t>(std::floor(c.real_budget));
  } else {
    SE_ASSIGN_OR_RETURN(c.budget, reader.get_int("budget", defaults.budget, 2, 1 << 30));
    c.real_budget = c.budget;
  }
  SE_ASSIGN_OR_RETURN(c.window, reader.get_int("window", defaults.window, 1, 1 << 16));
  SE_ASSIGN_OR_RETURN(c.kernel, reader.get_int("kernel", defaults.kernel, 1, 255));
  SE_ASSIGN_OR_RETURN(const std::string pooling,
                      reader.get_choice("pooling", defaults.pooling, {"avgpool", "maxpool"}));
  SE_ASSIGN_OR_RETURN(const std::string agg, reader.get_choice("gqa_agg", "mean", {"mean", "max", "sum"}));
  SE_ASSIGN_OR_RETURN(const std::string order,
                      reader.get_choice("gqa_order", defaults.gqa_order, {"pool_then_reduce", "reduce_then_pool"}));
  if (c.kernel % 2 == 0)
    return invalid_argument("{}: 'kernel' = {} must be odd (pooling pads kernel / 2 on each side)", method, c.kernel);
  if (c.real_budget <= c.window)
    return invalid_argument("{}: 'budget' = {} must exceed 'window' = {} (the budget includes the window)", method,
                            c.real_budget, c.window);
  c.pooling = pooling == "maxpool" ? WindowPooling::kMax : WindowPooling::kAvg;
  c.gqa_agg = group_reduce_named(agg);
  c.gqa_order = order == "reduce_then_pool" ? GroupOrder::kReduceThenPool : GroupOrder::kPoolThenReduce;
  return c;
}

void pool_scores(const float* in, float* out, int32_t n, int32_t kernel, WindowPooling pooling) {
  const int32_t pad = kernel / 2;
  const bool max_pool = pooling == WindowPooling::kMax;
  // Each out[j] folds in[first .. last] left to right from the padding's value; the interior, where no window is
  // cut, runs the same folds offset by offset across all j, element-wise loops that vectorize without changing
  // any result (a 128K-token prompt pools 32 heads in each of 32 layers while the device waits).
  const auto fold_edge = [&](int32_t j) {
    const int32_t first = std::max(0, j - pad), last = std::min(n - 1, j + pad);
    float acc = max_pool ? -std::numeric_limits<float>::infinity() : 0.0f;
    for (int32_t i = first; i <= last; ++i) acc = max_pool ? std::max(acc, in[i]) : acc + in[i];
    out[j] = max_pool ? acc : acc / static_cast<float>(kernel);
  };
  const int32_t interior_begin = std::min(pad, n), interior_end = std::max(interior_begin, n - pad);
  for (int32_t j = 0; j < interior_begin; ++j) fold_edge(j);
  for (int32_t j = interior_end; j < n; ++j) fold_edge(j);
  float* __restrict interior = out + interior_begin;  // in and out never overlap
  const int32_t count = interior_end - interior_begin;
  std::fill_n(interior, count, max_pool ? -std::numeric_limits<float>::infinity() : 0.0f);
  for (int32_t offset = -pad; offset <= pad; ++offset) {
    const float* __restrict src = in + interior_begin + offset;
    if (max_pool) {
#pragma omp simd
      for (int32_t j = 0; j < count; ++j) interior[j] = std::max(interior[j], src[j]);
    } else {
#pragma omp simd
      for (int32_t j = 0; j < count; ++j) interior[j] += src[j];
    }
  }
  if (!max_pool) {
#pragma omp simd
    for (int32_t j = 0; j < count; ++j) interior[j] /= static_cast<float>(kernel);
  }
}

WindowScores reduce_window_scores(const float* probs, int64_t row_stride, int32_t num_heads, int32_t num_kv_heads,
                                  int32_t num_tokens, const ObservationWindowConfig& config) {
  WindowScores s;
  s.num_kv_heads = num_kv_heads;
  s.num_tokens = num_tokens;
  s.num_prefix = std::max(0, num_tokens - config.window);
  const int32_t n = s.num_prefix;
  const int32_t group = num_heads / num_kv_heads;
  const float inv_window = 1.0f / static_cast<float>(config.window);
  // mean[h, j] = probs[h, j] / w over the prefix: [num_heads, n].
  // Scratch reused across layers: a 128K prompt's [H, T] would otherwise be two fresh 16 MB allocations per layer.
  thread_local std::vector<float> mean, pooled, reduced;
  mean.resize(static_cast<size_t>(num_heads) * n);
  for (int32_t h = 0; h < num_heads; ++h) {
    const float* __restrict src = probs + h * row_stride;
    float* __restrict dst = mean.data() + static_cast<size_t>(h) * n;
#pragma omp simd
    for (int32_t j = 0; j < n; ++j) dst[j] = src[j] * inv_window;
  }

  s.values.resize(static_cast<size_t>(num_kv_heads) * n);
  if (config.gqa_order == GroupOrder::kPoolThenReduce) {
    pooled.resize(mean.size());  // [num_heads, n]
    for (int32_t h = 0; h < num_heads; ++h)
      pool_scores(mean.data() + static_cast<size_t>(h) * n, pooled.data() + static_cast<size_t>(h) * n, n,
               config.kernel, config.pooling);
    for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh)
      reduce_group(pooled.data() + static_cast<size_t>(kvh) * group * n, n, group,
                   s.values.data() + static_cast<size_t>(kvh) * n, n, config.gqa_agg);
  } else {
    reduced.resize(static_cast<size_t>(n));
    for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh) {
      reduce_group(mean.data() + static_cast<size_t>(kvh) * group * n, n, group, reduced.data(), n, config.gqa_agg);
      pool_scores(reduced.data(), s.values.data() + static_cast<size_t>(kvh) * n, n, config.kernel, config.pooling);
    }
  }
  return s;
}

}  // namespace se
