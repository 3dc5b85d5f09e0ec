#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
constexpr int kThreads = 1024;

// The running state of one scan: the best (value, index) so far and sum(exp(x - value)) over what it saw.
struct ArgmaxState {
  float value;
  int index;
  float sum;
};

// Merges two partial scans: the larger value wins (the lower index on a tie); sums rescale to the new maximum.
__device__ __forceinline__ ArgmaxState merge(ArgmaxState a, ArgmaxState b) {
  const bool take_b = b.value > a.value || (b.value == a.value && b.index < a.index);
  const float value = take_b ? b.value : a.value;
  const float sum = (a.sum == 0.0f ? 0.0f : a.sum * __expf(a.value - value)) +
                    (b.sum == 0.0f ? 0.0f : b.sum * __expf(b.value - value));
  return {value, take_b ? b.index : a.index, sum};
}

__device__ __forceinline__ ArgmaxState warp_merge(ArgmaxState s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const ArgmaxState other{__shfl_xor_sync(0xffffffffu, s.value, offset),
                            __shfl_xor_sync(0xffffffffu, s.index, offset),
                            __shfl_xor_sync(0xffffffffu, s.sum, offset)};
    s = merge(s, other);
  }
  return s;
}

// One block per row: a strided scan per thread, then a warp and a block merge.
__global__ void argmax_rows_kernel(int32_t* ids, float* logprobs, const void* x, DType dtype, int64_t width) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * width;
  ArgmaxState s{-INFINITY, static_cast<int>(width), 0.0f};
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    s = merge(s, {load_as_float(x, dtype, base + i), static_cast<int>(i), 1.0f});
  s = warp_merge(s);
  __shared__ ArgmaxState partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  if (warp != 0) return;
  const int num_warps = static_cast<int>(blockDim.x) >> 5;
  s = warp_merge(lane < num_warps ? partial[lane] : ArgmaxState{-INFINITY, static_cast<int>(width), 0.0f});
  if (lane == 0) {
    ids[blockIdx.x] = s.index < width ? s.index : 0;  // a row of only -inf picks 0, as the CPU scan does
    logprobs[blockIdx.x] = -logf(s.sum);
  }
}
}  // namespace

void argmax_rows(TensorView ids, TensorView logprobs, TensorView x) {
  const int64_t rows = ids.numel();
  if (rows == 0) return;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, CudaContext::current().stream()>>>(
      ids.ptr<int32_t>(), logprobs.ptr<float>(), x.data, x.dtype, x.shape[x.shape.rank() - 1]);
  SE_CUDA_CHECK_LAUNCH("argmax_rows_kernel");
}

}  // namespace se::cuda
