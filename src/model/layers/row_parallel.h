// Row-parallel projections under tensor parallelism (tensor_parallel.h): a rank holds the input columns of o_proj
// or down that its heads or its part of the MLP width feed, so its product is one term of the whole projection,
// and an all-reduce over the ranks sums the terms. The residual stream joins on rank 0 only, so the sum counts it
// once. With one rank the all-reduce is a no-op and these are the plain ops. Stateless.
#pragma once

#include "backend/ops.h"
#include "parallel/communicator.h"

namespace se {

// h [t, hidden] += the sum over ranks of x_r w_r^T: rank 0 adds its product to h inside the GEMM, the others write
// theirs over h, and the all-reduce adds them up.
void row_parallel_linear_add(Communicator& comm, TensorView h, TensorView x, TensorView w);
// out [t, hidden] = the sum over ranks of x_r w_r^T.
void row_parallel_linear(Communicator& comm, TensorView out, TensorView x, TensorView w);

// For a sublayer that adds several terms into h itself (the experts' weighted outputs): begin keeps h on rank 0 and
// zeros it on the others; end all-reduces, so h gains every rank's terms and its old value once.
void begin_row_parallel_sum(Communicator& comm, TensorView h);
void end_row_parallel_sum(Communicator& comm, TensorView h);

}  // namespace se
