// WeightSink: where a load puts the weights it produces, one canonical weight (weight_spec.h) at a time, so that
// what each one is turned into (kept on the host, converted and uploaded to a GPU, checked and dropped) is the
// sink's business and the load itself never holds more than the weight in hand. Block-scaled FP8 weights reach a
// sink dequantized unless it asks for them as stored (keeps_fp8). WeightMapSink keeps them all in a
// name -> tensor map (what load_model returns). A sink is fed by one load on one thread.
#pragma once

#include <map>
#include <string>

#include "base/status.h"
#include "loader/fp8_block_weights.h"
#include "model/config.h"
#include "model/weight_spec.h"
#include "tensor/tensor.h"

namespace se {

class WeightSink {
 public:
  virtual ~WeightSink() = default;
  // Called once, before any weight, with the config of the model the weights belong to.
  virtual Status begin(const ModelConfig& config) = 0;
  // Weight `spec` as a host tensor shaped spec.shape (F32, F16 or BF16); the sink owns it from here. An error ends
  // the load.
  virtual Status put(const WeightSpec& spec, Tensor tensor) = 0;
  // Whether the sink takes weight `spec`, stored block-scaled FP8 under `q`, as its codes and scales (put_fp8)
  // rather than dequantized (put). The load asks before it reads the weight.
  virtual bool keeps_fp8(const WeightSpec& /*spec*/, const Fp8BlockQuantization& /*q*/) const { return false; }
  // Weight `spec` as the checkpoint stores it: e4m3 codes shaped spec.shape and their fp32 scales; only for
  // weights keeps_fp8 accepted.
  virtual Status put_fp8(const WeightSpec& spec, Fp8BlockWeight&& /*weight*/) {
    return unimplemented("weight '{}': this sink takes no FP8 weights", spec.name);
  }
};

class WeightMapSink final : public WeightSink {
 public:
  Status begin(const ModelConfig&) override { return Status::ok(); }
  Status put(const WeightSpec& spec, Tensor tensor) override {
    weights_[spec.name] = std::move(tensor);
    return Status::ok();
  }
  std::map<std::string, Tensor>& weights() { return weights_; }

 private:
  std::map<std::string, Tensor> weights_;
};

}  // namespace se
