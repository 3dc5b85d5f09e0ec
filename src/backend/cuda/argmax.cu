#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kPerThread = 16;
constexpr int kChunk = kThreads * kPerThread;  // elements one block of the first pass scans

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

// Merges a block's states; thread 0 gets the result.
__device__ ArgmaxState block_merge(ArgmaxState s, int width) {
  __shared__ ArgmaxState partial[32];
  s = warp_merge(s);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if (lane == 0) partial[warp] = s;
  __syncthreads();
  const int num_warps = static_cast<int>(blockDim.x) >> 5;
  return warp_merge(lane < num_warps ? partial[lane] : ArgmaxState{-INFINITY, width, 0.0f});
}

// First pass: block (chunk, row) scans kChunk elements of the row, each thread's kPerThread loads in flight at
// once, and leaves one state per chunk. A decode step's few rows of a 128K vocabulary then spread over the GPU
// instead of one block per row.
__global__ void __launch_bounds__(kThreads)
    argmax_chunks_kernel(ArgmaxState* chunk_states, const void* x, DType dtype, int64_t width) {
  const int64_t row = blockIdx.y;
  const int begin = static_cast<int>(blockIdx.x) * kChunk;
  const int count = static_cast<int>(width - begin < kChunk ? width - begin : kChunk);
  float v[kPerThread];
  load_fragment(v, x, dtype, row * width + begin, static_cast<int>(threadIdx.x), kThreads, count);
  ArgmaxState s{-INFINITY, static_cast<int>(width), 0.0f};
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = static_cast<int>(threadIdx.x) + j * kThreads;
    if (i < count) s = merge(s, {v[j], begin + i, 1.0f});
  }
  s = block_merge(s, static_cast<int>(width));
  if (threadIdx.x == 0) chunk_states[row * gridDim.x + blockIdx.x] = s;
}

// Second pass: one block per row merges its chunks' states.
__global__ void argmax_merge_kernel(int32_t* ids, float* logprobs, const ArgmaxState* chunk_states, int chunks,
                                    int64_t width) {
  const int64_t row = blockIdx.x;
  ArgmaxState s{-INFINITY, static_cast<int>(width), 0.0f};
  for (int c = static_cast<int>(threadIdx.x); c < chunks; c += static_cast<int>(blockDim.x))
    s = merge(s, chunk_states[row * chunks + c]);
  s = block_merge(s, static_cast<int>(width));
  if (threadIdx.x == 0) {
    ids[row] = s.index < width ? s.index : 0;  // a row of only -inf picks 0, as the CPU scan does
    logprobs[row] = -logf(s.sum);
  }
}
}  // namespace

void argmax_rows(TensorView ids, TensorView logprobs, TensorView x) {
  const int64_t rows = ids.numel();
  if (rows == 0) return;
  const int64_t width = x.shape[x.shape.rank() - 1];
  SE_CHECK(rows <= 65535, "cuda::argmax_rows: {} rows, at most 65535", rows);
  const auto chunks = static_cast<int>(launch::ceil_div(width, kChunk));
  CudaContext& context = CudaContext::current();
  auto* chunk_states = static_cast<ArgmaxState*>(context.scratch(sizeof(ArgmaxState) * rows * chunks));
  argmax_chunks_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)), kThreads, 0,
                         context.stream()>>>(chunk_states, x.data, x.dtype, width);
  SE_CUDA_CHECK_LAUNCH("argmax_chunks_kernel");
  argmax_merge_kernel<<<static_cast<unsigned>(rows), 64, 0, context.stream()>>>(
      ids.ptr<int32_t>(), logprobs.ptr<float>(), chunk_states, chunks, width);
  SE_CUDA_CHECK_LAUNCH("argmax_merge_kernel");
}

}  // namespace se::cuda
