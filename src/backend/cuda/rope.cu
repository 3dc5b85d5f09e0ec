#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
constexpr int kMaxHalf = 256;  // rotary_dim <= 512

// The inverse frequencies travel as a kernel parameter: no device table to keep in sync with
// RopeParams.
struct InvFreq {
  float value[kMaxHalf];
};

// One block per token: cos/sin of each frequency once into shared memory, then every head of x0 and of x1
// rotated with them. The angle is fp32 position * inv_freq, as the CPU reference (and HF) compute it.
__global__ void rope_kernel(void* x0, int64_t heads0, void* x1, int64_t heads1, DType dtype,
                            const int32_t* positions, int64_t head_dim, int half, InvFreq inv_freq) {
  __shared__ float cos_v[kMaxHalf];
  __shared__ float sin_v[kMaxHalf];
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    sincosf(pos * inv_freq.value[i], &sin_v[i], &cos_v[i]);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < (heads0 + heads1) * half; j += blockDim.x) {
    int64_t h = j / half;
    const int i = static_cast<int>(j - h * half);
    const bool first = h < heads0;
    void* x = first ? x0 : x1;
    const int64_t heads = first ? heads0 : heads1;
    if (!first) h -= heads0;
    const int64_t base = (t * heads + h) * head_dim;
    const float a = load_as_float(x, dtype, base + i);
    const float b = load_as_float(x, dtype, base + i + half);
    store_from_float(x, dtype, base + i, a * cos_v[i] - b * sin_v[i]);
    store_from_float(x, dtype, base + i + half, b * cos_v[i] + a * sin_v[i]);
  }
}
}  // namespace

void rope(TensorView x0, TensorView x1, TensorView positions, const RopeParams& params) {
  const int half = params.rotary_dim / 2;
  SE_CHECK(half <= kMaxHalf, "cuda::rope: rotary_dim {} over {}", params.rotary_dim, 2 * kMaxHalf);
  const int64_t num_tokens = x0.shape[0];
  if (num_tokens == 0) return;
  InvFreq inv_freq{};
  cpu::rope_inv_freq(params, inv_freq.value);
  const int64_t heads1 = x1.data != nullptr ? x1.shape[1] : 0;
  rope_kernel<<<static_cast<unsigned>(num_tokens), 128, 0, CudaContext::current().stream()>>>(
      x0.data, x0.shape[1], x1.data, heads1, x0.dtype, positions.ptr<int32_t>(), x0.shape[2], half, inv_freq);
  SE_CUDA_CHECK_LAUNCH("rope_kernel");
}

}  // namespace se::cuda
