// ModelRunner: executes a StepPlan. It packs the scheduled tokens of every request into one ForwardBatch
// (prefill chunks and decode tokens together), runs the model with the sparse controller as its hooks
// (prepare_step, the forward, sampling, finish_step), and samples the next token of every request whose known
// tokens are now all computed. On CUDA a step whose sampled requests are all greedy (without logprobs) picks its
// tokens on the device and copies back only the ids and their logprobs; any other step copies the sampled logit
// rows to the host for the CPU sampler. Engine thread only.
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
  // Runs the model's forwards in `workspace`; also lets the controller run the model for methods' transient
  // passes.
  ModelRunner(const Model& model, SparseController& controller, ForwardWorkspace workspace)
      : model_(model), controller_(controller), workspace_(std::move(workspace)) {
    controller_.set_pass_forward(
        [this](const ForwardBatch& batch) { (void)model_.forward(batch, controller_, workspace_); });
  }
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs the forward of `plan` and returns the sampled tokens (the requests' states are not changed).
  std::vector<SampledToken> execute(const StepPlan& plan);

 private:
  // One result per row of `logits` [requests.size(), vocab] (on the model's device), in order.
  std::vector<SampleResult> sample(const Tensor& logits, const std::vector<Request*>& requests);

  const Model& model_;
  SparseController& controller_;
  ForwardWorkspace workspace_;
  ForwardBatch batch_;  // reused across steps
  Tensor device_ids_;       // [capacity] I32 on the device: greedy tokens
  Tensor device_logprobs_;  // [capacity] F32 on the device: their logprobs
  std::vector<int32_t> host_ids_;
  std::vector<float> host_logprobs_;
  std::vector<float> host_logits_;  // [rows, vocab] when the CPU sampler runs on device logits
};

}  // namespace se
