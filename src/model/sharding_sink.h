// ShardingSink: the WeightSink a tensor-parallel load streams into. It hands each weight of the whole model to the
// sink of every rank it serves (a ModelWeightsBuilder each), cut to that rank's part (tensor_parallel.h), so each
// rank keeps only its slice and the load reads the checkpoint once for all of them. The rank sinks see their rank's
// shard_config. Not thread-safe, as any sink; the rank sinks must outlive it.
#pragma once

#include <utility>
#include <vector>

#include "model/weight_sink.h"

namespace se {

class ShardingSink final : public WeightSink {
 public:
  explicit ShardingSink(int size) : size_(size) {}

  // Rank `rank`'s weights go to `sink`. Call before the load.
  void add_rank(int rank, WeightSink& sink) { ranks_.emplace_back(rank, &sink); }

  // Errors: what shard_config refuses.
  Status begin(const ModelConfig& config) override;
  Status put(const WeightSpec& spec, Tensor tensor) override;

 private:
  int size_;
  ModelConfig config_;  // the whole model's
  std::vector<std::pair<int, WeightSink*>> ranks_;
};

}  // namespace se
