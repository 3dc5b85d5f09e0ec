// Model: a decoder-only transformer (the architectures in model/arch/) with its weights, run module by module
// in native order. It owns no KV state: every layer's attention goes through the caller's ForwardHooks,
// which also hear each layer's end.
// forward() is not reentrant (it reuses the model's scratch buffers); one engine thread drives a Model.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "model/forward_hooks.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/weights.h"

namespace se {

class Model {
 public:
  // Normalizes `hf_config` and binds `tensors` (HF names); errors name the bad key or tensor.
  static Result<Model> create(const nlohmann::json& hf_config, const std::map<std::string, Tensor>& tensors);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }

  // Runs `batch` and returns fp32 logits [batch.logit_rows.size(), vocab].
  Tensor forward(const ForwardBatch& batch, ForwardHooks& hooks) const;

 private:
  Model(ModelConfig config, ModelWeights weights) : config_(std::move(config)), weights_(std::move(weights)) {}

  // One decoder block over the hidden states h [T, hidden] (updated in place).
  void run_layer(int layer, const ForwardBatch& batch, Tensor& h, ForwardHooks& hooks) const;

  ModelConfig config_;
  ModelWeights weights_;
};

}  // namespace se
