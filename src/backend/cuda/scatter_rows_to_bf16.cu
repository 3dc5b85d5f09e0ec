// CUDA twin of scatter_rows_to_bf16 (the CPU reference is backend/cpu/scatter_rows_to_bf16.cpp): one block per
// entry of the device table rounds its source row to bf16 at the entry's destination (__float2bfloat16:
// nearest-even, as f32_to_bf16), so a batch's rows of one layer cost one launch.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"

namespace se::cuda {

namespace {

constexpr int kThreads = 256;

// src [rows, row_elements] F32; rows [gridDim.x] on the device.
__global__ void scatter_rows_to_bf16_kernel(const float* src, int64_t row_elements, const RowDestination* rows,
                                            int64_t dest_offset) {
  const RowDestination row = rows[blockIdx.x];
  const float* from = src + row.source_row * row_elements;
  auto* to = static_cast<__nv_bfloat16*>(row.dest) + dest_offset;
  for (int64_t i = threadIdx.x; i < row_elements; i += blockDim.x) to[i] = __float2bfloat16(from[i]);
}

}  // namespace

void scatter_rows_to_bf16(TensorView src, TensorView rows, int64_t dest_offset) {
  scatter_rows_to_bf16_kernel<<<static_cast<unsigned>(rows.shape[0]), kThreads, 0, CudaContext::current().stream()>>>(
      src.ptr<float>(), src.numel() / src.shape[0], rows.ptr<RowDestination>(), dest_offset);
  SE_CUDA_CHECK_LAUNCH("scatter_rows_to_bf16_kernel");
}

}  // namespace se::cuda
