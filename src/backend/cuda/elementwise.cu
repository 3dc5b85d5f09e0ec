#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
constexpr int kThreads = 256;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
// GELU with the tanh approximation (`gelu_pytorch_tanh`), as the CPU reference.
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

__global__ void gated_activation_kernel(void* out, DType out_dtype, const void* gate_up,
                                        DType in_dtype, int64_t width, int64_t n, Activation act) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / width;
    const int64_t col = i - row * width;
    const float gate = load_as_float(gate_up, in_dtype, row * 2 * width + col);
    const float up = load_as_float(gate_up, in_dtype, row * 2 * width + width + col);
    const float y = (act == Activation::kSilu ? silu(gate) : gelu_tanh(gate)) * up;
    store_from_float(out, out_dtype, i, y);
  }
}

enum class Unary : uint8_t { kScale, kSoftcap };

__global__ void unary_kernel(void* x, DType dtype, int64_t n, Unary op, float s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = load_as_float(x, dtype, i);
    store_from_float(x, dtype, i, op == Unary::kScale ? v * s : s * tanhf(v / s));
  }
}

__global__ void add_kernel(void* x, DType x_dtype, const void* y, DType y_dtype, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_from_float(x, x_dtype, i, load_as_float(x, x_dtype, i) + load_as_float(y, y_dtype, i));
}

__global__ void convert_kernel(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_from_float(dst, dst_dtype, i, load_as_float(src, src_dtype, i));
}

void launch_unary(TensorView x, Unary op, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  unary_kernel<<<launch::grid_for(n, kThreads), kThreads, 0, CudaContext::current().stream()>>>(
      x.data, x.dtype, n, op, s);
  SE_CUDA_CHECK_LAUNCH("unary_kernel");
}

}  // namespace

void gated_activation(TensorView out, TensorView gate_up, Activation act) {
  const int64_t width = out.shape[out.shape.rank() - 1];
  const int64_t n = out.numel();
  if (n == 0) return;
  gated_activation_kernel<<<launch::grid_for(n, kThreads), kThreads, 0,
                            CudaContext::current().stream()>>>(out.data, out.dtype, gate_up.data,
                                                               gate_up.dtype, width, n, act);
  SE_CUDA_CHECK_LAUNCH("gated_activation_kernel");
}

void add_inplace(TensorView x, TensorView y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  add_kernel<<<launch::grid_for(n, kThreads), kThreads, 0, CudaContext::current().stream()>>>(
      x.data, x.dtype, y.data, y.dtype, n);
  SE_CUDA_CHECK_LAUNCH("add_kernel");
}

void scale_inplace(TensorView x, float s) { launch_unary(x, Unary::kScale, s); }

void softcap_inplace(TensorView x, float cap) { launch_unary(x, Unary::kSoftcap, cap); }

void convert(TensorView dst, TensorView src) {
  const int64_t n = dst.numel();
  convert_kernel<<<launch::grid_for(n, kThreads), kThreads, 0, CudaContext::current().stream()>>>(
      dst.data, dst.dtype, src.data, src.dtype, n);
  SE_CUDA_CHECK_LAUNCH("convert_kernel");
}

}  // namespace se::cuda
