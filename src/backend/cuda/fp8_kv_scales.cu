// fp8_kv_scales on the GPU: one block per (KV head, K or V) takes the largest magnitude of the head's elements over
// the batch's rows and makes it a scale as fp8_scale_from_max does (backend/quant/fp8_kv.h). The maximum is exact
// and the division IEEE, so the scales are the CPU's bit for bit.
#include <cub/block/block_reduce.cuh>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/quant/fp8_kv.h"

namespace se::cuda {

namespace {
constexpr int kThreads = 512;

struct MaxMagnitude {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// blockIdx.x: the KV head; blockIdx.y: 0 for K, 1 for V.
__global__ void __launch_bounds__(kThreads)
    fp8_kv_scales_kernel(float* k_scales, float* v_scales, const void* k, const void* v, DType dtype, int64_t rows,
                         int heads, int dim) {
  const int h = static_cast<int>(blockIdx.x);
  const bool values = blockIdx.y == 1;
  const void* x = values ? v : k;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < rows * dim; i += kThreads)
    m = fmaxf(m, fabsf(load_as_float(x, dtype, (i / dim * heads + h) * dim + i % dim)));
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  m = Reduce(temp).Reduce(m, MaxMagnitude{});
  if (threadIdx.x != 0) return;
  const float divisor = values ? kFp8ValueScaleDivisor : kFp8KeyScaleDivisor;
  (values ? v_scales : k_scales)[h] = m > 0.0f ? m / divisor : 1.0f;  // fp8_scale_from_max
}
}  // namespace

void fp8_kv_scales(TensorView k_scales, TensorView v_scales, TensorView k, TensorView v) {
  const dim3 grid(static_cast<unsigned>(k.shape[1]), 2);
  fp8_kv_scales_kernel<<<grid, kThreads, 0, CudaContext::current().stream()>>>(
      k_scales.ptr<float>(), v_scales.ptr<float>(), k.data, v.data, k.dtype, k.shape[0], static_cast<int>(k.shape[1]),
      static_cast<int>(k.shape[2]));
  SE_CUDA_CHECK_LAUNCH("fp8_kv_scales_kernel");
}

}  // namespace se::cuda
