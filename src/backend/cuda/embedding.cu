#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
// One block per token: out[t] = table[ids[t]] converted to out's dtype.
__global__ void embedding_kernel(void* out, DType out_dtype, const void* table, DType table_dtype,
                                 const int32_t* ids, int64_t dim) {
  const int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[t]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    store_from_float(out, out_dtype, t * dim + i, load_as_float(table, table_dtype, row + i));
}
// One block per token: out[t] = table[ids[t] - first_row], or zeros where that row is another rank's.
__global__ void vocab_shard_embedding_kernel(void* out, DType out_dtype, const void* table, DType table_dtype,
                                             const int32_t* ids, int64_t rows, int64_t dim, int64_t first_row) {
  const int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[t]) - first_row;
  const bool own = row >= 0 && row < rows;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    store_from_float(out, out_dtype, t * dim + i, own ? load_as_float(table, table_dtype, row * dim + i) : 0.0f);
  }
}
}  // namespace

void vocab_shard_embedding(TensorView out, TensorView table, TensorView ids, int64_t first_row) {
  const int64_t num_tokens = ids.numel();
  if (num_tokens == 0) return;
  vocab_shard_embedding_kernel<<<static_cast<unsigned>(num_tokens), 256, 0, CudaContext::current().stream()>>>(
      out.data, out.dtype, table.data, table.dtype, ids.ptr<int32_t>(), table.shape[0], table.shape[1], first_row);
  SE_CUDA_CHECK_LAUNCH("vocab_shard_embedding_kernel");
}

void embedding(TensorView out, TensorView table, TensorView ids) {
  const int64_t num_tokens = ids.numel();
  if (num_tokens == 0) return;
  embedding_kernel<<<static_cast<unsigned>(num_tokens), 256, 0, CudaContext::current().stream()>>>(
      out.data, out.dtype, table.data, table.dtype, ids.ptr<int32_t>(), table.shape[1]);
  SE_CUDA_CHECK_LAUNCH("embedding_kernel");
}

}  // namespace se::cuda
