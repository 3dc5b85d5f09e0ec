// LocalCommGroup: a communicator group whose ranks are threads of one process over host memory, what tensor
// parallelism runs on with the CPU backend (and what tests run the sharded forward with). The group owns one
// Communicator per rank; rank r's thread drives communicator(r) and no other. A collective waits until every rank
// has posted its buffers, reads the others' buffers in place, and waits again before returning (two barriers per
// collective), so no rank reuses a buffer another still reads. all_reduce_sum adds the ranks' values in rank order (0,
// 1, ...), each element by one thread, so the result does not depend on thread timing and every rank holds the same
// bits. Ranks whose calls do not match (another collective, size, dtype or root) fail an SE_CHECK naming both.
#pragma once

#include <barrier>
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace se {

class LocalCommGroup final {
 public:
  // Precondition: size >= 1.
  explicit LocalCommGroup(int size);
  LocalCommGroup(const LocalCommGroup&) = delete;
  LocalCommGroup& operator=(const LocalCommGroup&) = delete;
  ~LocalCommGroup();

  int size() const { return static_cast<int>(ranks_.size()); }
  Communicator& communicator(int rank);

 private:
  class Rank;
  enum class Op : uint8_t { kAllReduceSum, kAllGather, kBroadcast, kBarrier };
  // What one rank handed to the collective in progress.
  struct Posted {
    Op op = Op::kBarrier;
    void* data = nullptr;      // the buffer the rank's result goes to
    const void* in = nullptr;  // all_gather's input (else data)
    int64_t numel = 0;         // of `in`
    DType dtype = DType::kF32;
    int root = 0;
  };

  static const char* op_name(Op op);
  // Posts rank `rank`'s part, waits for every rank, and checks that all posted the same collective.
  void post_and_wait(int rank, const Posted& posted);
  void wait_for_all() { barrier_.arrive_and_wait(); }

  std::vector<Posted> posted_;  // [size], slot r written by rank r only, between two barriers
  std::barrier<> barrier_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace se
