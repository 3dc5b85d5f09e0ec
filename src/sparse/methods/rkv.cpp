#include "sparse/methods/rkv.h"

#include <algorithm>

namespace se {

Result<std::unique_ptr<MethodRuntime>> RkvMethod::create(const nlohmann::json& config,
                                                         std::unique_ptr<MethodRuntime> prompt_method) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("rkv", config));
  RkvParams params;
  SE_ASSIGN_OR_RETURN(params.budget, reader.get_int("budget", params.budget, 2, 1 << 20));
  SE_ASSIGN_OR_RETURN(params.buffer, reader.get_int("buffer", params.buffer, 1, 1 << 20));
  SE_ASSIGN_OR_RETURN(params.window, reader.get_int("window", params.window, 1, 1 << 16));
  SE_ASSIGN_OR_RETURN(params.kernel, reader.get_int("kernel", params.kernel, 1, 1 << 10));
  SE_ASSIGN_OR_RETURN(const double mix_lambda, reader.get_double("mix_lambda", 0.07, 0.0, 1.0));
  SE_RETURN_IF_ERROR(reader.finish());
  params.mix_lambda = static_cast<float>(mix_lambda);
  if (params.kernel % 2 == 0) return invalid_argument("rkv: 'kernel' = {} must be odd", params.kernel);
  if (params.window >= params.budget)
    return invalid_argument("rkv: 'window' = {} must be below 'budget' = {}", params.window, params.budget);
  if (params.buffer < params.window)
    return invalid_argument(
        "rkv: 'buffer' = {} must be at least 'window' = {} (the window's queries are decode "
        "queries)",
        params.buffer, params.window);
  return std::unique_ptr<MethodRuntime>(new RkvMethod(reader.resolved(), params, std::move(prompt_method)));
}

RkvMethod::RkvMethod(nlohmann::ordered_json config, const RkvParams& params,
                     std::unique_ptr<MethodRuntime> prompt_method)
    : DecodeCompressionMethod("rkv", std::move(config), params.window, std::move(prompt_method)), params_(params) {
  traits_.ops.insert(traits_.ops.end(),
                     {OpId::kGroupMaxAttentionImportance, OpId::kKeyRedundancy, OpId::kRedundancyAwareScores});
}

std::optional<DecodeCompressionMethod::Region> RkvMethod::plan_compression(const Clock& clock) const {
  if (!rkv_should_compress(clock.num_generated_resident, clock.num_decoded, 1, params_)) return std::nullopt;
  // Every generated token resident: positions from the prompt's end on.
  return Region{clock.num_logical - clock.num_decoded, clock.num_logical, params_.window};
}

void RkvMethod::score(TensorView out, TensorView queries, TensorView keys) {
  rkv_score(out, queries, keys, params_, scratch_);
}

std::vector<int32_t> RkvMethod::select(const float* scores, int32_t n) const { return rkv_keep(scores, n, params_); }

int32_t RkvMethod::peak_generated_tokens(int32_t num_decoded) const {
  // Uncompressed until the first multiple of buffer at or past budget + buffer, which is the most ever resident:
  // each later compression starts from budget + buffer.
  const int64_t first =
      (int64_t{params_.budget} + params_.buffer + params_.buffer - 1) / params_.buffer * params_.buffer;
  return static_cast<int32_t>(std::min<int64_t>(num_decoded, first));
}

}  // namespace se
