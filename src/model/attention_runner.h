// AttentionRunner: the seam between the model and whatever owns the KV state. The model calls attend() once
// per layer, in layer order, with the batch's new q/k/v after RoPE; the runner stores k/v in its cache, decides
// what attention reads, and writes the output. The model never sees pages, selections or methods.
#pragma once

#include "backend/ops.h"
#include "model/config.h"
#include "model/forward_batch.h"

namespace se {

class AttentionRunner {
 public:
  virtual ~AttentionRunner() = default;

  // q, out [T, H, D]; k, v [T, Hkv, D], all F32 rows of `batch`.
  virtual void attend(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q,
                      TensorView k, TensorView v, TensorView out, const AttentionParams& params) = 0;
};

}  // namespace se
