#include "parallel/communicator.h"

#include "backend/device_memory.h"
#include "base/check.h"

namespace se {

void SingleRankCommunicator::all_gather(TensorView out, TensorView in) {
  SE_CHECK(out.numel() == in.numel() && out.dtype == in.dtype, "all_gather: out {} for in {}", out.shape.to_string(),
           in.shape.to_string());
  if (out.data != in.data) copy(out, in);
}

Communicator& single_rank_communicator() {
  static SingleRankCommunicator communicator;
  return communicator;
}

}  // namespace se
