#include "engine/prune_scoring.h"

#include <optional>

#include "engine/teacher_forcing.h"
#include "sparse/prune/prune_scorer.h"
#include "sparse/step_driver.h"

namespace se {

namespace {

// The scratch sequence: the whole token sequence is one prefill forward (a window scorer reads its last rows).
TeacherForcingOptions scratch_options(std::span<const int32_t> tokens, const PruneScoringOptions& options) {
  TeacherForcingOptions o;
  o.page_size = options.page_size;
  o.prefill_chunk = static_cast<int>(tokens.size());
  o.max_tokens = static_cast<int32_t>(tokens.size());
  o.environment = options.environment;
  return o;
}

// A sequence id no request uses (the engine's ids are >= 0).
constexpr int32_t kScoringSeq = -1;

using MaybeScores = std::optional<std::vector<float>>;

// The pass on top of the engine's cached prefix, computing only the scorer's suffix, or nullopt when that cannot
// be done without changing anything (pages that would have to be evicted).
Result<MaybeScores> scores_on_cache(const Model& model, std::span<const int32_t> tokens, PruneScorer& scorer,
                                    int32_t suffix, CacheManager& cache) {
  const auto num_tokens = static_cast<int32_t>(tokens.size());
  if (num_tokens <= suffix) return MaybeScores();
  // The suffix's queries must be computed here: attach only the cached blocks before it.
  const std::span<const int32_t> before_suffix = tokens.first(static_cast<size_t>(num_tokens - suffix));
  Result<RadixCache::PrefixMatch> cached = cache.inspect_prefix(before_suffix);
  if (!cached.is_ok()) return MaybeScores();
  SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> method, scorer.make_method(cached->resident_positions));
  SparseController controller(*method, cache, model.device());
  // A prompt one token longer matches exactly the blocks inspect_prefix found (the last token stays uncached).
  SE_ASSIGN_OR_RETURN(const int32_t num_cached,
                      controller.open(kScoringSeq, tokens.first(before_suffix.size() + 1)));
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
  append_sequence(batch, kScoringSeq, tokens.subspan(static_cast<size_t>(num_cached)), num_cached, num_tokens,
                  /*logit_row=*/true);
  ForwardWorkspace workspace = model.make_workspace();
  run_step(controller, batch, [&] { return model.forward(batch, controller, workspace); },
           [](const Tensor&) {});
  controller.close(kScoringSeq);  // its own pages go back; the prefix it attached is unlocked
  SE_ASSIGN_OR_RETURN(std::vector<float> scores, scorer.position_scores(kScoringSeq, model.config(), num_tokens));
  return MaybeScores(std::move(scores));
}

}  // namespace

Result<std::vector<float>> score_positions(const Model& model, std::span<const int32_t> tokens,
                                           const PruneScoringOptions& options) {
  if (tokens.empty()) return invalid_argument("prune scoring: no tokens");
  SE_ASSIGN_OR_RETURN(std::unique_ptr<PruneScorer> scorer,
                      make_prune_scorer(options.policy, {options.window, options.environment}));
  const std::optional<int32_t> suffix = scorer->computed_suffix();
  if (options.cache != nullptr && suffix) {
    SE_ASSIGN_OR_RETURN(MaybeScores scores, scores_on_cache(model, tokens, *scorer, *suffix, *options.cache));
    if (scores) return std::move(*scores);
  }
  SE_ASSIGN_OR_RETURN(std::unique_ptr<MethodRuntime> method, scorer->make_method({}));
  SE_ASSIGN_OR_RETURN(std::unique_ptr<TeacherForcedSequence> sequence,
                      TeacherForcedSequence::create(model, std::move(method), scratch_options(tokens, options)));
  SE_RETURN_IF_ERROR(sequence->prefill(tokens).status());
  return scorer->position_scores(TeacherForcedSequence::kSeq, model.config(), static_cast<int32_t>(tokens.size()));
}

}  // namespace se
