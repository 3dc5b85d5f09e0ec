// BlockInputs: what one decoder block of a forward reads: the layer's index, config and weights, the batch, the
// caller's hooks and workspace, and the model's communicator. A block function (one per architecture, model/arch/)
// composes the layers of model/layers/ over these; it updates the residual stream ws.hidden(t) in place and writes only
// the workspace. A plain bundle of references, alive for one block call.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/forward_batch.h"
#include "model/forward_hooks.h"
#include "model/forward_workspace.h"
#include "model/weights.h"
#include "parallel/communicator.h"

namespace se {

struct BlockInputs {
  int layer;
  const ModelConfig& config;
  const LayerConfig& layer_config;
  const LayerWeights& weights;
  const ForwardBatch& batch;
  int64_t t;  // rows of the batch
  ForwardHooks& hooks;
  const ForwardWorkspace& ws;
  // The model's tensor-parallel group (size 1 when it is not split): row-parallel layers sum their partial
  // products over it (row_parallel.h).
  Communicator& comm;
};

// One decoder block: ws.hidden(t) [t, hidden] in, the same rows updated in place out.
using BlockFn = void (*)(const BlockInputs& in);

}  // namespace se
