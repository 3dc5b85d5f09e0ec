#include "sparse/methods/pyramidkv.h"

#include <algorithm>
#include <cmath>

#include "base/top_k.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> PyramidKvMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("pyramidkv", config));
  SE_ASSIGN_OR_RETURN(const std::string schedule,
                      reader.get_choice("schedule", "kvpress", {"kvpress", "kvcache_factory"}));
  ObservationWindowDefaults defaults;
  // kvpress's budget is real-valued; an integer budget stays an integer in the resolved config.
  defaults.fractional_budget = schedule == "kvpress" && config.is_object() && config.contains("budget") &&
                               config.at("budget").is_number_float();
  SE_ASSIGN_OR_RETURN(const ObservationWindowConfig window_config,
                      read_observation_window_config(reader, "pyramidkv", defaults));
  SE_ASSIGN_OR_RETURN(const int beta, reader.get_int("beta", 20, 1, 1 << 20));
  SE_RETURN_IF_ERROR(reader.finish());
  return std::unique_ptr<MethodRuntime>(
      new PyramidKvMethod(reader.resolved(), window_config,
                          schedule == "kvpress" ? PyramidSchedule::kKvpress : PyramidSchedule::kKvCacheFactory,
                          beta));
}

int32_t PyramidKvMethod::kvpress_layer_tokens(int32_t num_prompt_tokens, double budget, int32_t window,
                                              int32_t beta, int num_layers, int layer) {
  // The operations and their order are kvpress's, in doubles, so every comparison and round() agrees (NOTE:
  // as long as the compiler fuses no multiply-add, as on the x86-64 baseline we build for).
  const double w = window, num_tokens = num_prompt_tokens;
  const double capacity = w + budget;  // kvpress's max_capacity_prompt
  double min_num = (capacity - w) / beta;
  double max_num = (capacity - w) * 2 - min_num;
  if (max_num >= num_tokens - w) {
    max_num = num_tokens - w;
    min_num = (capacity - w) * 2 - max_num;
  }
  if (!(num_tokens >= max_num && max_num >= min_num && min_num >= w))
    return static_cast<int32_t>(std::max(1.0, std::nearbyint(budget)));  // the uniform fallback
  const double step = num_layers > 1 ? (max_num - min_num) / (num_layers - 1) : 0.0;
  return static_cast<int32_t>(std::nearbyint(max_num - layer * step));  // half to even (default rounding mode)
}

int32_t PyramidKvMethod::layer_prefix_budget(int32_t num_prompt_tokens, int32_t budget, int32_t window,
                                             int32_t beta, int num_layers, int layer) {
  const int64_t base = int64_t{budget} - window;  // C - w
  const int64_t num_prefix = int64_t{num_prompt_tokens} - window;
  if (num_prompt_tokens < 2 * base || num_layers <= 1) return static_cast<int32_t>(std::min(base, num_prefix));
  int64_t min_num = base / beta;
  int64_t max_num = 2 * base - min_num;
  if (max_num >= num_prefix) {
    max_num = num_prefix;
    min_num = 2 * base - max_num;
  }
  const int64_t step = (max_num - min_num) / (num_layers - 1);  // both >= 0 here, so / floors like Python's //
  return static_cast<int32_t>(max_num - layer * step);
}

int32_t PyramidKvMethod::num_prefix_kept(int32_t num_prompt_tokens, int num_layers, int layer) const {
  const ObservationWindowConfig& c = window_config();
  const int32_t num_prefix = num_prompt_tokens - c.window;
  const int32_t kept =
      schedule_ == PyramidSchedule::kKvpress
          ? kvpress_layer_tokens(num_prompt_tokens, c.real_budget, c.window, beta_, num_layers, layer) - c.window
          : layer_prefix_budget(num_prompt_tokens, c.budget, c.window, beta_, num_layers, layer);
  return std::clamp(kept, 0, std::max(0, num_prefix));
}

std::vector<std::vector<int32_t>> PyramidKvMethod::select_prefix(const WindowScores& scores, int layer,
                                                                 int num_layers) const {
  const int32_t num_kept = num_prefix_kept(scores.num_tokens, num_layers, layer);
  std::vector<std::vector<int32_t>> kept;
  kept.reserve(static_cast<size_t>(scores.num_kv_heads));
  for (int32_t h = 0; h < scores.num_kv_heads; ++h)
    kept.push_back(top_k_ascending(scores.head(h), scores.num_prefix, num_kept));
  return kept;
}

int64_t PyramidKvMethod::compressed_pages(const KvLayout& layout, int32_t num_prompt_tokens,
                                          int32_t num_decode_tokens) const {
  int64_t pages = 0;
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    const int64_t num_tokens = int64_t{num_prefix_kept(num_prompt_tokens, layout.num_layers, layer)} +
                               window_config().window + num_decode_tokens;
    pages += layout.num_kv_heads * layout.pages_per_stream(num_tokens);
  }
  return pages;
}

}  // namespace se
