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

// One block per row. With a residual: residual += x is stored first, and the norm reads the stored
// (rounded) sum, as the next layer will. Each thread rereads only the elements it wrote, so out may
// alias x.
__global__ void rms_norm_kernel(NormArgs a) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * a.dim;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) {
    float v = load_as_float(a.x, a.x_dtype, base + i);
    if (a.residual != nullptr) {
      v = round_to(a.residual_dtype, load_as_float(a.residual, a.residual_dtype, base + i) + v);
      store_from_float(a.residual, a.residual_dtype, base + i, v);
    }
    sum_sq += v * v;
  }
  const float inv = rsqrtf(block_sum(sum_sq) / static_cast<float>(a.dim) + a.eps);
  const void* src = a.residual != nullptr ? a.residual : a.x;
  const DType src_dtype = a.residual != nullptr ? a.residual_dtype : a.x_dtype;
  for (int64_t i = threadIdx.x; i < a.dim; i += blockDim.x) {
    const float v = load_as_float(src, src_dtype, base + i);
    store_from_float(a.out, a.out_dtype, base + i,
                     v * inv * load_as_float(a.weight, a.weight_dtype, i));
  }
}

void launch_norm(const NormArgs& a, int64_t rows) {
  if (rows == 0) return;
  const int threads = a.dim >= 1024 ? 512 : 128;
  rms_norm_kernel<<<static_cast<unsigned>(rows), threads, 0, CudaContext::current().stream()>>>(a);
  SE_CUDA_CHECK_LAUNCH("rms_norm_kernel");
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
