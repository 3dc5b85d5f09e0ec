// NcclCommGroup: tensor parallelism's communicator group over NCCL, one rank per GPU of this host, all driven from
// one process (one thread per rank, as the CPU's LocalCommGroup). Rank r runs on CUDA device r; its collectives are
// enqueued on the current CudaContext's stream (backend/cuda/cuda_context.h) of the thread that calls them, which
// must be a context on device r, so they order with the forward's kernels without a host wait (barrier() waits).
// Built only with NCCL (SE_WITH_NCCL). The group owns the NCCL communicators; destroy it after every rank stopped.
#pragma once

#include <memory>
#include <vector>

#include "base/status.h"
#include "parallel/communicator.h"

namespace se {

class NcclCommGroup final {
 public:
  // A group over CUDA devices 0 .. size - 1; errors name what NCCL or CUDA refused.
  static Result<std::unique_ptr<NcclCommGroup>> create(int size);
  NcclCommGroup(const NcclCommGroup&) = delete;
  NcclCommGroup& operator=(const NcclCommGroup&) = delete;
  ~NcclCommGroup();

  int size() const { return static_cast<int>(ranks_.size()); }
  Communicator& communicator(int rank);

 private:
  class Rank;
  NcclCommGroup();

  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace se
