#include "model/layers/row_parallel.h"

#include "backend/device_memory.h"

namespace se {

void row_parallel_linear_add(Communicator& comm, TensorView h, TensorView x, TensorView w) {
  if (comm.rank() == 0) {
    linear_add(h, x, w);
  } else {
    linear(h, x, w);
  }
  comm.all_reduce_sum(h);
}

void row_parallel_linear(Communicator& comm, TensorView out, TensorView x, TensorView w) {
  linear(out, x, w);
  comm.all_reduce_sum(out);
}

void begin_row_parallel_sum(Communicator& comm, TensorView h) {
  if (comm.rank() != 0) fill_zero(h);
}

void end_row_parallel_sum(Communicator& comm, TensorView h) { comm.all_reduce_sum(h); }

}  // namespace se
