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
  c.gqa_agg = agg == "max" ? GroupAgg::kMax : agg == "sum" ? GroupAgg::kSum : GroupAgg::kMean;
  c.gqa_order = order == "reduce_then_pool" ? GroupOrder::kReduceThenPool : GroupOrder::kPoolThenReduce;
  return c;
}

void pool_scores(const float* in, float* out, int32_t n, int32_t kernel, WindowPooling pooling) {
  const int32_t pad = kernel / 2;
  for (int32_t j = 0; j < n; ++j) {
    const int32_t first = std::max(0, j - pad), last = std::min(n - 1, j + pad);
    if (pooling == WindowPooling::kMax) {
      float m = -std::numeric_limits<float>::infinity();  // the padding
      for (int32_t i = first; i <= last; ++i) m = std::max(m, in[i]);
      out[j] = m;
    } else {
      float sum = 0.0f;  // the padding adds zeros, and still counts in the divisor
      for (int32_t i = first; i <= last; ++i) sum += in[i];
      out[j] = sum / static_cast<float>(kernel);
    }
  }
}

namespace {

// out[j] = agg over the group's rows rows[g * stride + j], g < group.
void reduce_group(const float* rows, int64_t stride, int32_t group, float* out, int32_t n, GroupAgg agg) {
  for (int32_t j = 0; j < n; ++j) {
    float r = rows[j];
    for (int32_t g = 1; g < group; ++g) {
      const float s = rows[g * stride + j];
      r = agg == GroupAgg::kMax ? std::max(r, s) : r + s;
    }
    out[j] = agg == GroupAgg::kMean ? r / static_cast<float>(group) : r;
  }
}

}  // namespace

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
  std::vector<float> mean(static_cast<size_t>(num_heads) * n);
  for (int32_t h = 0; h < num_heads; ++h)
    for (int32_t j = 0; j < n; ++j) mean[static_cast<size_t>(h) * n + j] = probs[h * row_stride + j] * inv_window;

  s.values.resize(static_cast<size_t>(num_kv_heads) * n);
  if (config.gqa_order == GroupOrder::kPoolThenReduce) {
    std::vector<float> pooled(mean.size());  // [num_heads, n]
    for (int32_t h = 0; h < num_heads; ++h)
      pool_scores(mean.data() + static_cast<size_t>(h) * n, pooled.data() + static_cast<size_t>(h) * n, n,
               config.kernel, config.pooling);
    for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh)
      reduce_group(pooled.data() + static_cast<size_t>(kvh) * group * n, n, group,
                   s.values.data() + static_cast<size_t>(kvh) * n, n, config.gqa_agg);
  } else {
    std::vector<float> reduced(static_cast<size_t>(n));
    for (int32_t kvh = 0; kvh < num_kv_heads; ++kvh) {
      reduce_group(mean.data() + static_cast<size_t>(kvh) * group * n, n, group, reduced.data(), n, config.gqa_agg);
      pool_scores(reduced.data(), s.values.data() + static_cast<size_t>(kvh) * n, n, config.kernel, config.pooling);
    }
  }
  return s;
}

}  // namespace se
