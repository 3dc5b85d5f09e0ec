// ModelRunner: executes a StepPlan. It packs the scheduled tokens of every request into one ForwardBatch
// (prefill chunks and decode tokens together), runs the model over the cache manager, and samples the next
// token of every request whose known tokens are now all computed. Engine thread only.
#pragma once

#include <vector>

#include "engine/scheduler.h"
#include "model/model.h"
#include "sparse/cache_manager.h"

namespace se {

struct SampledToken {
  Request* request = nullptr;
  SampleResult sample;
};

class ModelRunner {
 public:
  ModelRunner(const Model& model, CacheManager& cache) : model_(model), cache_(cache) {}

  // Runs the forward of `plan` and returns the sampled tokens (the requests' states are not changed).
  std::vector<SampledToken> execute(const StepPlan& plan);

 private:
  const Model& model_;
  CacheManager& cache_;
  ForwardBatch batch_;  // reused across steps
};

}  // namespace se
