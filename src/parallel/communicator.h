// Communicator: the collectives tensor parallelism runs on, seen from one rank of a group of size() ranks. Every
// rank of the group calls the same collectives in the same order with buffers of the same shape and dtype; a call
// returns once this rank's result is in place (on CUDA: once it is enqueued on the current stream, ahead of
// whatever follows). Implementations: SingleRankCommunicator (size 1: every collective leaves its buffers as they
// are), LocalCommGroup (ranks as threads of one process, the CPU backend's) and NcclCommunicator (one GPU each).
// One thread drives a rank's communicator; ranks run concurrently.
#pragma once

#include "tensor/tensor.h"

namespace se {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data [any] F32 (BF16 too on CUDA): every rank's buffer becomes the elementwise sum of all ranks' buffers.
  virtual void all_reduce_sum(TensorView data) = 0;
  // out [size() * in.numel()] of in's dtype: rank r's `in` lands at element r * in.numel(), on every rank.
  virtual void all_gather(TensorView out, TensorView in) = 0;
  // data [any]: every rank's buffer becomes rank `root`'s.
  virtual void broadcast(TensorView data, int root) = 0;
  // Returns once every rank has called it (on CUDA: once every rank's work enqueued before it has finished).
  virtual void barrier() = 0;
};

// The group of one: what a model that is not sharded runs with.
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(TensorView) override {}
  void all_gather(TensorView out, TensorView in) override;
  void broadcast(TensorView, int) override {}
  void barrier() override {}
};

// A process-wide SingleRankCommunicator (stateless, so shared by every unsharded model).
Communicator& single_rank_communicator();

}  // namespace se
