#include "sparse/methods/kara.h"

#include <algorithm>

#include "backend/ops.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> KaraMethod::create(const nlohmann::json& config,
                                                          std::unique_ptr<MethodRuntime> prompt_method) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("kara", config));
  KaraParams params;
  SE_ASSIGN_OR_RETURN(params.window, reader.get_int("window", params.window, 1, 1 << 16));
  SE_ASSIGN_OR_RETURN(params.buffer, reader.get_int("buffer", params.buffer, 0, 1 << 16));
  SE_ASSIGN_OR_RETURN(params.candidates, reader.get_int("candidates", params.candidates, 1, 1 << 16));
  SE_ASSIGN_OR_RETURN(params.budget, reader.get_int("budget", params.budget, 1, 1 << 16));
  SE_ASSIGN_OR_RETURN(params.period, reader.get_int("period", params.period, 1, 1 << 20));
  SE_ASSIGN_OR_RETURN(const double gamma, reader.get_double("length_exponent", params.length_exponent, 0.0, 16.0));
  SE_RETURN_IF_ERROR(reader.finish());
  params.length_exponent = static_cast<float>(gamma);
  if (params.budget > params.window)
    return invalid_argument("kara: 'budget' = {} exceeds 'window' = {} (it is what the window keeps)", params.budget,
                            params.window);
  return std::unique_ptr<MethodRuntime>(new KaraMethod(reader.resolved(), params, std::move(prompt_method)));
}

KaraMethod::KaraMethod(nlohmann::ordered_json config, const KaraParams& params,
                       std::unique_ptr<MethodRuntime> prompt_method)
    : DecodeCompressionMethod("kara", std::move(config), params.window + params.buffer, std::move(prompt_method)),
      params_(params) {
  traits_.ops.insert(traits_.ops.end(), {OpId::kBidirectionalWindowScores});
}

std::optional<DecodeCompressionMethod::Region> KaraMethod::plan_compression(const Clock& clock) const {
  if (!kara_should_compress(clock.num_decoded, clock.num_logical - clock.uncompressed_from, params_))
    return std::nullopt;
  const int32_t window_start = clock.num_logical - params_.window - params_.buffer;
  return Region{window_start, window_start + params_.window, params_.window + params_.buffer};
}

void KaraMethod::score(TensorView out, TensorView queries, TensorView keys) {
  bidirectional_window_scores(out, queries, keys);
}

std::vector<int32_t> KaraMethod::select(const float* scores, int32_t n) const {
  return kara_select_tokens(scores, n, params_).kept;
}

int32_t KaraMethod::peak_generated_tokens(int32_t num_decoded) const {
  // The periodic policy over single-token decode steps (kara_should_compress), jumping from period to period:
  // the generated tokens resident peak just before each compression and otherwise grow with every step.
  const int64_t span = int64_t{params_.window} + params_.buffer;
  int64_t compressed = 0, uncompressed = 0, peak = 0;
  for (int64_t decoded = params_.period; decoded <= num_decoded; decoded += params_.period) {
    uncompressed += params_.period;
    if (uncompressed < span) continue;
    peak = std::max(peak, compressed + uncompressed);
    // Older uncompressed tokens stay whole, the compressible region keeps budget, the buffer stays.
    compressed += uncompressed - span + params_.budget;
    uncompressed = params_.buffer;
  }
  const int64_t last = compressed + uncompressed + num_decoded % params_.period;
  return static_cast<int32_t>(std::max(peak, last));
}

}  // namespace se
