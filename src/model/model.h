// Model: a decoder-only transformer (the architectures in model/arch/) with its weights, run module by module
// in native order on the device its weights live on (CPU or CUDA: one forward, written against backend/ops.h).
// Each layer runs its architecture's block function (model/arch/<arch>.cpp), composed from model/layers/.
// It owns no KV state and no activations: every layer's attention goes through the caller's ForwardHooks, which
// also hear each layer's end, and every forward runs in the caller's ForwardWorkspace. Immutable after create(),
// so threads may run forwards concurrently, each with its own workspace.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/forward_batch.h"
#include "model/forward_hooks.h"
#include "model/forward_workspace.h"
#include "model/weights.h"

namespace se {

struct ArchSpec;

class Model {
 public:
  // Binds `tensors` (canonical HF names, weight_spec.h) to `config` and places the weights on `device`; errors
  // name the missing or mis-shaped tensor, or what `device` cannot run.
  static Result<Model> create(const ModelConfig& config, const std::map<std::string, Tensor>& tensors,
                              Device device = Device::kCpu);
  // A model of weights built for `device` (weights_builder.h), e.g. by a streaming load.
  static Result<Model> from_weights(const ModelConfig& config, ModelWeights weights, Device device);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  Device device() const { return device_; }

  // An empty workspace for this model's forwards (reserve() it to allocate up front; forward grows it on demand).
  ForwardWorkspace make_workspace() const { return ForwardWorkspace(config_, device_, weights_.matmul_dtype()); }

  // Runs `batch` in `workspace` and returns its logits [batch.logit_rows.size(), vocab] F32 on device(): a view of
  // the workspace, valid until its next forward (clone() to keep it).
  Tensor forward(const ForwardBatch& batch, ForwardHooks& hooks, ForwardWorkspace& workspace) const;

  // forward() in its two halves, for drivers that replay the second as a CUDA graph: prepare_forward copies the
  // batch's inputs into the workspace and runs the hooks' begin_forward (host work, every step); launch_forward
  // enqueues the layers and the logits, reading the inputs only from the workspace, so for a batch of the same
  // shape it enqueues the same kernels on the same buffers.
  void prepare_forward(const ForwardBatch& batch, ForwardHooks& hooks, ForwardWorkspace& workspace) const;
  Tensor launch_forward(const ForwardBatch& batch, ForwardHooks& hooks, const ForwardWorkspace& workspace) const;

 private:
  Model(const ArchSpec& arch, ModelConfig config, ModelWeights weights, Device device);

  const ArchSpec* arch_;  // the registry's entry: static, never null
  ModelConfig config_;
  ModelWeights weights_;
  Device device_;
};

}  // namespace se
