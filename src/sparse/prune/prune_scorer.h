// PruneScorer: the scoring pass of one prefix-pruning policy (prune_policy.h) behind one interface, so the
// engine's prune scoring runs every policy alike without naming a method: the scorer builds the method a scratch
// sequence runs (its hooks record what the policy needs), then turns what that method recorded into one score
// per position. make_prune_scorer is the registry keyed by PrunePolicy. One scorer per scoring pass; engine
// thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/config.h"
#include "sparse/method_environment.h"
#include "sparse/method_runtime.h"
#include "sparse/prune/prune_policy.h"

namespace se {

struct PruneScorerOptions {
  int32_t window = 32;            // the observation window of a window-attention policy
  MethodEnvironment environment;  // what the method would get from the engine (tokenizer, chat suffix)
};

class PruneScorer {
 public:
  virtual ~PruneScorer() = default;

  // How many of the sequence's last tokens the pass must compute itself when it runs on top of the engine's
  // cached prefix (the rest attached read only); nullopt when it cannot and needs a scratch sequence that
  // computes every token.
  virtual std::optional<int32_t> computed_suffix() const = 0;
  // Builds the method the pass runs. `attached_positions`: the positions the slots of an attached cached prefix
  // hold, ascending (empty when none is attached). The scorer keeps a view of the method: it must stay alive
  // until position_scores returns.
  virtual Result<std::unique_ptr<MethodRuntime>> make_method(std::vector<int32_t> attached_positions) = 0;
  // [num_tokens] one score per position (higher = keep) once sequence `seq` of the method built last has
  // been prefilled with the `num_tokens` tokens. Errors: the pass did not record what the policy needs.
  virtual Result<std::vector<float>> position_scores(int32_t seq, const ModelConfig& config,
                                                     int32_t num_tokens) const = 0;
};

Result<std::unique_ptr<PruneScorer>> make_prune_scorer(PrunePolicy policy, const PruneScorerOptions& options);

}  // namespace se
