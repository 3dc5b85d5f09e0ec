// The prune scorer registry: the one place that maps a prefix-pruning policy to its scorer.
#include "sparse/prune/kvzip_global_scorer.h"
#include "sparse/prune/prune_scorer.h"
#include "sparse/prune/snapkv_global_scorer.h"

namespace se {

Result<std::unique_ptr<PruneScorer>> make_prune_scorer(PrunePolicy policy, const PruneScorerOptions& options) {
  switch (policy) {
    case PrunePolicy::kSnapKvGlobal: return make_snapkv_global_prune_scorer(options);
    case PrunePolicy::kKvzipGlobal: return make_kvzip_global_prune_scorer(options);
  }
  return invalid_argument("no scorer for prune policy {}", static_cast<int>(policy));
}

}  // namespace se
