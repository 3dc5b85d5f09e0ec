#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
struct NormArgs {
  void* out;
  DType out_dtype;
  void* residual;  // nullptr for plain rms_norm
  DType residual_dtype;
  const void* x;
  DType x_dtype;
  const void* weight;
  DType weight_dtype;
  int64_t dim;
  float eps;
};

// One block per row, each thread holding kPerThread elements in registers: all of a row's loads are issued
// before the first is used, so a decode step's one-row norm costs one memory latency, not one per element.
// With a residual: residual += x is stored first, and the norm uses the stored (rounded) sum, as the next
// layer will read it. Every load precedes every store, so out may alias x.
template <int kPerThread>
__global__ void __launch_bounds__(1024) rms_norm_kernel(NormArgs a) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * a.dim;
  const int first = static_cast<int>(threadIdx.x);
  const int step = static_cast<int>(blockDim.x);
  const int dim = static_cast<int>(a.dim);
  float v[kPerThread];
  float w[kPerThread];
  load_fragment(v, a.x, a.x_dtype, base, first, step, dim);
  load_fragment(w, a.weight, a.weight_dtype, 0, first, step, dim);
  if (a.residual != nullptr) {
    float r[kPerThread];
    load_fragment(r, a.residual, a.residual_dtype, base, first, step, dim);
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) v[j] = round_to(a.residual_dtype, r[j] + v[j]);
    store_fragment(a.residual, a.residual_dtype, base, first, step, dim, v);
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) sum_sq += v[j] * v[j];
  const float inv = rsqrtf(block_sum(sum_sq) / static_cast<float>(a.dim) + a.eps);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) v[j] = v[j] * inv * w[j];
  store_fragment(a.out, a.out_dtype, base, first, step, dim, v);
}

template <int kPerThread>
void launch_norm_kernel(const NormArgs& a, int64_t rows) {
  const int threads =
      static_cast<int>(launch::ceil_div(launch::ceil_div(a.dim, kPerThread), 32) * 32);
  rms_norm_kernel<kPerThread>
      <<<static_cast<unsigned>(rows), threads, 0, CudaContext::current().stream()>>>(a);
  SE_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

// 4, 8 or 16 elements per thread and at most 1024 threads (the launch bound keeps the 16-element variant within a
// 1024-thread block's registers): rows up to 16384 wide.
void launch_norm(const NormArgs& a, int64_t rows) {
  if (rows == 0) return;
  SE_CHECK(a.dim <= 16 * 1024, "cuda::rms_norm: rows of {} elements, at most 16384", a.dim);
  if (a.dim <= 4 * 512) {
    launch_norm_kernel<4>(a, rows);
  } else if (a.dim <= 8 * 1024) {
    launch_norm_kernel<8>(a, rows);
  } else {
    launch_norm_kernel<16>(a, rows);
  }
}
}  // namespace

void rms_norm(TensorView out, TensorView x, TensorView weight, float eps) {
  const int64_t dim = x.shape[x.shape.rank() - 1];
  launch_norm(NormArgs{out.data, out.dtype, nullptr, DType::kF32, x.data, x.dtype, weight.data,
                       weight.dtype, dim, eps},
              x.numel() / dim);
}

void add_rms_norm(TensorView out, TensorView residual, TensorView x, TensorView weight, float eps) {
  const int64_t dim = x.shape[x.shape.rank() - 1];
  launch_norm(NormArgs{out.data, out.dtype, residual.data, residual.dtype, x.data, x.dtype,
                       weight.data, weight.dtype, dim, eps},
              x.numel() / dim);
}

}  // namespace se::cuda
