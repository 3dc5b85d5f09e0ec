#include "engine/prune_scoring.h"

#include "engine/teacher_forcing.h"
#include "sparse/methods/kvzip.h"
#include "sparse/prune/snapkv_global_scorer.h"

namespace se {

namespace {

// The scratch sequence: the whole token sequence is one prefill forward (snapkv_global reads its last rows).
TeacherForcingOptions scratch_options(std::span<const int32_t> tokens, const PruneScoringOptions& options) {
  TeacherForcingOptions o;
  o.page_size = options.page_size;
  o.prefill_chunk = static_cast<int>(tokens.size());
  o.max_tokens = static_cast<int32_t>(tokens.size());
  o.environment = options.environment;
  return o;
}

Result<std::vector<float>> snapkv_global_scores(const Model& model, std::span<const int32_t> tokens,
                                                const PruneScoringOptions& options) {
  auto scorer = std::make_unique<SnapKvGlobalScorer>(options.window);
  const SnapKvGlobalScorer* scores = scorer.get();
  SE_ASSIGN_OR_RETURN(std::unique_ptr<TeacherForcedSequence> sequence,
                      TeacherForcedSequence::create(model, std::move(scorer), scratch_options(tokens, options)));
  SE_RETURN_IF_ERROR(sequence->prefill(tokens).status());
  return scores->position_scores();
}

Result<std::vector<float>> kvzip_global_scores(const Model& model, std::span<const int32_t> tokens,
                                               const PruneScoringOptions& options) {
  TeacherForcingOptions o = scratch_options(tokens, options);
  // Every position is context (no sinks); a ratio below 1 makes the passes run (the scratch eviction after
  // them is discarded with the sequence).
  o.method = "kvzip";
  o.config = {{"ratio", 0.5}, {"n_sink", 0}};
  SE_ASSIGN_OR_RETURN(std::unique_ptr<TeacherForcedSequence> sequence, TeacherForcedSequence::create(model, o));
  SE_RETURN_IF_ERROR(sequence->prefill(tokens).status());
  const auto& kvzip = dynamic_cast<const KvzipMethod&>(sequence->method());
  const std::span<const float> scores = kvzip.last_scores(TeacherForcedSequence::kSeq);
  const ModelConfig& config = model.config();
  const auto num_tokens = static_cast<int32_t>(tokens.size());
  if (scores.size() != static_cast<size_t>(config.num_layers) * config.num_kv_heads * tokens.size())
    return failed_precondition("kvzip_global: the reconstruction passes did not run for {} tokens", num_tokens);
  return kvzip_position_scores(scores, config.num_layers, config.num_kv_heads, num_tokens);
}

}  // namespace

Result<std::vector<float>> score_positions(const Model& model, std::span<const int32_t> tokens,
                                           const PruneScoringOptions& options) {
  if (tokens.empty()) return invalid_argument("prune scoring: no tokens");
  return options.policy == PrunePolicy::kSnapKvGlobal ? snapkv_global_scores(model, tokens, options)
                                                      : kvzip_global_scores(model, tokens, options);
}

}  // namespace se
