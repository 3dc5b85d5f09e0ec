#include "model/sharding_sink.h"

#include "model/tensor_parallel.h"

namespace se {

Status ShardingSink::begin(const ModelConfig& config) {
  config_ = config;
  for (auto& [rank, sink] : ranks_) {
    SE_ASSIGN_OR_RETURN(ModelConfig shard, shard_config(config, ShardLayout{rank, size_}));
    SE_RETURN_IF_ERROR(sink->begin(shard));
  }
  return Status::ok();
}

Status ShardingSink::put(const WeightSpec& spec, Tensor tensor) {
  for (auto& [rank, sink] : ranks_) {
    Tensor part = shard_weight(config_, ShardLayout{rank, size_}, spec, tensor);
    WeightSpec part_spec = spec;
    part_spec.shape = part.shape();
    SE_RETURN_IF_ERROR(sink->put(part_spec, std::move(part)));
  }
  return Status::ok();
}

}  // namespace se
