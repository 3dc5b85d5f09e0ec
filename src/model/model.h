// Model: a decoder-only transformer (the architectures in model/arch/) with its weights, run module by module
// in native order on the device its weights live on (CPU or CUDA: one forward, written against backend/ops.h).
// Each layer runs its architecture's block function (model/arch/<arch>.cpp), composed from model/layers/.
// It owns no KV state and no activations: every layer's attention goes through the caller's ForwardHooks, which
// also hear each layer's end, and every forward runs in the caller's ForwardWorkspace. Immutable after create(),
// so threads may run forwards concurrently, each with its own workspace. A tensor-parallel rank's model
// (tensor_parallel.h) holds its part of the weights and runs its forwards as collectives over its communicator:
// every rank of the group runs each forward with the same batch, one forward at a time.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/forward_batch.h"
#include "model/forward_hooks.h"
#include "model/forward_workspace.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace se {

struct ArchSpec;

class Model {
 public:
  // Binds `tensors` (canonical HF names, weight_spec.h) of the model `config` describes, and places the weights on
  // `device`; with a communicator of size > 1, only rank comm.rank()'s part of them. Errors name the missing or
  // mis-shaped tensor, what `device` cannot run, or what does not split over comm.size() ranks.
  static Result<Model> create(const ModelConfig& config, const std::map<std::string, Tensor>& tensors,
                              Device device = Device::kCpu, Communicator& comm = single_rank_communicator());
  // A model of weights built for `device` (weights_builder.h), e.g. by a streaming load; a tensor-parallel rank's
  // `config` is its shard_config, whose layout `comm` must match.
  static Result<Model> from_weights(const ModelConfig& config, ModelWeights weights, Device device,
                                    Communicator& comm = single_rank_communicator());

  // The rank's config: with tensor parallelism its head, KV head and MLP counts are the rank's part.
  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  Device device() const { return device_; }
  // The tensor-parallel group its forwards run their collectives on (a single rank unless sharded).
  Communicator& communicator() const { return *comm_; }

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
  Model(const ArchSpec& arch, ModelConfig config, ModelWeights weights, Device device, Communicator& comm);

  // h [t, hidden] = the embeddings of `ids` [t]; a rank looks up the tokens of its vocabulary rows, an all-reduce
  // joins the ranks'.
  void embed(TensorView h, TensorView ids) const;
  // logits [r, vocab] = x [r, hidden] times the head; each rank computes its vocabulary rows' logits in the
  // workspace, an all-gather joins them.
  void project_logits(TensorView logits, TensorView x, const ForwardWorkspace& ws) const;

  const ArchSpec* arch_;  // the registry's entry: static, never null
  ModelConfig config_;
  ModelWeights weights_;
  Device device_;
  Communicator* comm_;  // never null; outlives the model
};

}  // namespace se
