#include "engine/prune_scoring.h"

#include <optional>

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

// A sequence slot no request uses (the engine's slots are >= 0).
constexpr int32_t kScoringSeq = -1;

using MaybeScores = std::optional<std::vector<float>>;

// snapkv_global on top of the engine's cached prefix, or nullopt when that cannot be done without changing
// anything (pages that would have to be evicted).
Result<MaybeScores> snapkv_global_scores_on_cache(const Model& model, std::span<const int32_t> tokens,
                                                  const PruneScoringOptions& options) {
  CacheManager& cache = *options.cache;
  const auto num_tokens = static_cast<int32_t>(tokens.size());
  if (num_tokens <= options.window) return MaybeScores();
  // The window's queries must be computed here: attach only the cached blocks before it.
  const std::span<const int32_t> before_window = tokens.first(static_cast<size_t>(num_tokens - options.window));
  Result<RadixCache::PrefixMatch> cached = cache.inspect_prefix(before_window);
  if (!cached.is_ok()) return MaybeScores();
  SnapKvGlobalScorer scorer(options.window);
  scorer.set_attached_positions(cached->resident_positions);
  SparseController controller(scorer, cache, model.device());
  // A prompt one token longer matches exactly the blocks inspect_prefix found (the last token stays uncached).
  SE_ASSIGN_OR_RETURN(const int32_t num_cached,
                      controller.open(kScoringSeq, tokens.first(before_window.size() + 1)));
  if (num_cached != cached->num_cached_tokens) {
    controller.close(kScoringSeq);
    return MaybeScores();
  }
  const int32_t num_new = num_tokens - num_cached;
  if (cache.pages_to_reserve(kScoringSeq, num_new) > cache.num_free_pages()) {
    controller.close(kScoringSeq);
    return MaybeScores();
  }
  const Status reserved = cache.reserve(kScoringSeq, num_new);
  if (!reserved.is_ok()) {
    controller.close(kScoringSeq);
    return MaybeScores();
  }
  ForwardBatch batch;
  batch.token_ids.assign(tokens.begin() + num_cached, tokens.end());
  batch.positions.resize(static_cast<size_t>(num_new));
  for (int32_t i = 0; i < num_new; ++i) batch.positions[static_cast<size_t>(i)] = num_cached + i;
  batch.sequences = {{kScoringSeq, 0, num_new, num_tokens}};
  batch.logit_rows = {num_new - 1};
  ForwardWorkspace workspace = model.make_workspace();
  controller.prepare_step(batch);
  (void)model.forward(batch, controller, workspace);
  controller.finish_step(batch);
  controller.close(kScoringSeq);  // its own pages go back; the prefix it attached is unlocked
  SE_ASSIGN_OR_RETURN(std::vector<float> scores, scorer.position_scores());
  return MaybeScores(std::move(scores));
}

Result<std::vector<float>> snapkv_global_scores(const Model& model, std::span<const int32_t> tokens,
                                                const PruneScoringOptions& options) {
  if (options.cache != nullptr) {
    SE_ASSIGN_OR_RETURN(MaybeScores scores,
                        snapkv_global_scores_on_cache(model, tokens, options));
    if (scores) return std::move(*scores);
  }
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
