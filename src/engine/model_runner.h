// ModelRunner: executes a StepPlan. It packs the scheduled tokens of every request into one ForwardBatch
// (prefill chunks and decode tokens together), runs the model with the sparse controller as its hooks
// (prepare_step, the forward, sampling, finish_step), and samples the next token of every request whose known
// tokens are now all computed. Engine thread only.
#pragma once

#include <vector>

#include "engine/scheduler.h"
#include "model/model.h"
#include "sparse/sparse_controller.h"

namespace se {

struct SampledToken {
  Request* request = nullptr;
  SampleResult sample;
};

class ModelRunner {
 public:
  // Also lets the controller run the model for methods' transient passes.
  ModelRunner(const Model& model, SparseController& controller) : model_(model), controller_(controller) {
    controller_.set_pass_forward([this](const ForwardBatch& batch) { (void)model_.forward(batch, controller_); });
  }
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs the forward of `plan` and returns the sampled tokens (the requests' states are not changed).
  std::vector<SampledToken> execute(const StepPlan& plan);

 private:
  const Model& model_;
  SparseController& controller_;
  ForwardBatch batch_;  // reused across steps
};

}  // namespace se
