// Constrained decoding on the device: a grammar's allowed-token bits applied to the logits rows before sampling,
// and the model's logprob of each sampled token read from the unmasked rows. CPU twins in
// cpu/constrained_sampling.cpp.
#include <cub/cub.cuh>

#include <cfloat>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {

constexpr int kMaskThreads = 256;
constexpr int kRowThreads = 256;

// One thread per element of a row; blockIdx.y is the row.
__global__ void mask_refused_tokens_kernel(void* out, const void* x, DType dtype, const uint64_t* allowed,
                                           int64_t width, int64_t words) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMaskThreads + threadIdx.x;
  if (i >= width) return;
  const int64_t at = static_cast<int64_t>(blockIdx.y) * width + i;
  const bool ok = (allowed[static_cast<int64_t>(blockIdx.y) * words + i / 64] >> (i % 64)) & 1;
  store_from_float(out, dtype, at, ok ? load_as_float(x, dtype, at) : -INFINITY);
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }
};

// One block per row: its maximum, the sum of exp(x - max) in fp64 as the CPU adds it, then the chosen token's
// log-softmax.
__global__ void __launch_bounds__(kRowThreads)
    token_logprobs_kernel(float* logprobs, const void* x, DType dtype, const int32_t* ids, int64_t width) {
  using ReduceF = cub::BlockReduce<float, kRowThreads>;
  using ReduceD = cub::BlockReduce<double, kRowThreads>;
  __shared__ union {
    typename ReduceF::TempStorage f;
    typename ReduceD::TempStorage d;
  } temp;
  __shared__ float row_max;
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * width;
  float m = -FLT_MAX;
  for (int64_t i = threadIdx.x; i < width; i += kRowThreads) m = fmaxf(m, load_as_float(x, dtype, offset + i));
  m = ReduceF(temp.f).Reduce(m, MaxOp{});
  if (threadIdx.x == 0) row_max = m;
  __syncthreads();
  m = row_max;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < width; i += kRowThreads)
    sum += exp(static_cast<double>(load_as_float(x, dtype, offset + i)) - static_cast<double>(m));
  sum = ReduceD(temp.d).Sum(sum);
  if (threadIdx.x == 0) {
    const double logit = load_as_float(x, dtype, offset + ids[blockIdx.x]);
    logprobs[blockIdx.x] = static_cast<float>(logit - static_cast<double>(m) - log(sum));
  }
}

}  // namespace

void mask_refused_tokens(TensorView out, TensorView x, TensorView allowed) {
  const int64_t rows = x.shape[0], width = x.shape[1];
  if (rows == 0) return;
  SE_CHECK(rows <= 65535, "cuda::mask_refused_tokens: {} rows, at most 65535", rows);
  const dim3 grid(static_cast<unsigned>(launch::ceil_div(width, kMaskThreads)), static_cast<unsigned>(rows));
  mask_refused_tokens_kernel<<<grid, kMaskThreads, 0, CudaContext::current().stream()>>>(
      out.data, x.data, x.dtype, reinterpret_cast<const uint64_t*>(allowed.ptr<int64_t>()), width, allowed.shape[1]);
  SE_CUDA_CHECK_LAUNCH("mask_refused_tokens_kernel");
}

void token_logprobs(TensorView logprobs, TensorView x, TensorView ids) {
  const int64_t rows = ids.numel();
  if (rows == 0) return;
  token_logprobs_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, CudaContext::current().stream()>>>(
      logprobs.ptr<float>(), x.data, x.dtype, ids.ptr<int32_t>(), x.shape[1]);
  SE_CUDA_CHECK_LAUNCH("token_logprobs_kernel");
}

}  // namespace se::cuda
