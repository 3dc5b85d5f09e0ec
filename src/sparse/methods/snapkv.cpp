#include "sparse/methods/snapkv.h"

#include <utility>

#include "base/top_k.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> SnapKvMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("snapkv", config));
  SE_ASSIGN_OR_RETURN(const ObservationWindowConfig window_config,
                      read_observation_window_config(reader, "snapkv", ObservationWindowDefaults{}));
  SE_RETURN_IF_ERROR(reader.finish());
  return std::unique_ptr<MethodRuntime>(new SnapKvMethod(reader.resolved(), window_config));
}

SnapKvMethod::SnapKvMethod(nlohmann::ordered_json config, const ObservationWindowConfig& window_config)
    : ObservationWindowMethod("snapkv", std::move(config), window_config) {}

std::vector<std::vector<int32_t>> SnapKvMethod::select_prefix(const WindowScores& scores, int /*layer*/,
                                                              int /*num_layers*/) const {
  const int32_t num_kept = window_config().budget - window_config().window;
  std::vector<std::vector<int32_t>> kept;
  kept.reserve(static_cast<size_t>(scores.num_kv_heads));
  for (int32_t h = 0; h < scores.num_kv_heads; ++h)
    kept.push_back(top_k_ascending(scores.head(h), scores.num_prefix, num_kept));
  return kept;
}

int64_t SnapKvMethod::compressed_pages(const KvLayout& layout, int32_t /*num_prompt_tokens*/,
                                       int32_t num_decode_tokens) const {
  return layout.pages_for_tokens(int64_t{window_config().budget} + num_decode_tokens);
}

}  // namespace se
