// The projections around multi-head latent attention on the GPU, twins of the CPU ops: rope_latent_heads (one
// block per (token, head): the head in shared memory, its RMS norm and its RoPE part moved to the rotate-half
// layout and rotated, the CPU's arithmetic), absorb_latent_queries (W_uk per head through head_gemm, the RoPE part
// copied beside it) and head_gemm itself (16 rows x 64 columns of one head per CTA, both operands staged in shared
// memory in tiles of 32 along k, so either orientation of kv_b is read coalesced).
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/latent_head_gemm.h"

namespace se::cuda {

namespace {

constexpr int kMaxRopeDim = 256;
constexpr int kRopeThreads = 128;

struct LatentHeadsArgs {
  const void* x;
  DType x_dtype;
  void* out;
  DType out_dtype;
  const int32_t* positions;
  const float* norm_weight;  // [first] or null
  float eps;
  int32_t heads, first, rope_dim;
  float attention_factor;
  float inv_freq[kMaxRopeDim / 2];
};

__global__ void __launch_bounds__(kRopeThreads) rope_latent_heads_kernel(const LatentHeadsArgs a) {
  extern __shared__ float head[];  // [first + rope_dim]
  const int64_t token = blockIdx.x;
  const int width = a.first + a.rope_dim, half = a.rope_dim / 2;
  const int64_t base = (token * a.heads + blockIdx.y) * width;
  float square_sum = 0.0f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const float v = load_as_float(a.x, a.x_dtype, base + i);
    head[i] = v;
    if (i < a.first) square_sum += v * v;
  }
  // Every read of x is done before the first write of out, which may alias it.
  const float total = block_sum(square_sum);
  const float inv_rms = a.norm_weight != nullptr ? rsqrtf(total / static_cast<float>(a.first) + a.eps) : 1.0f;
  for (int i = threadIdx.x; i < a.first; i += blockDim.x) {
    const float v = a.norm_weight != nullptr ? head[i] * inv_rms * a.norm_weight[i] : head[i];
    store_from_float(a.out, a.out_dtype, base + i, v);
  }
  const float position = static_cast<float>(a.positions[token]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // The checkpoint's pair (2i, 2i + 1) turns as the rotate-half pair (i, i + half) at frequency i.
    float sin_v, cos_v;
    sincosf(position * a.inv_freq[i], &sin_v, &cos_v);
    cos_v *= a.attention_factor;
    sin_v *= a.attention_factor;
    const float x0 = head[a.first + 2 * i], x1 = head[a.first + 2 * i + 1];
    store_from_float(a.out, a.out_dtype, base + a.first + i, x0 * cos_v - x1 * sin_v);
    store_from_float(a.out, a.out_dtype, base + a.first + half + i, x1 * cos_v + x0 * sin_v);
  }
}

// q_latent[t, h, rank + i] = q[t, h, nope + i]: each head's rotated RoPE part, beside its absorbed nope part.
__global__ void copy_rope_parts_kernel(void* q_latent, DType latent_dtype, const void* q, DType q_dtype,
                                       int64_t num_heads, int nope, int rope_dim, int rank) {
  const int64_t n = num_heads * rope_dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t head = i / rope_dim;
    const int d = static_cast<int>(i - head * rope_dim);
    store_from_float(q_latent, latent_dtype, head * (rank + rope_dim) + rank + d,
                     load_as_float(q, q_dtype, head * (nope + rope_dim) + nope + d));
  }
}

constexpr int kGemmRows = 16, kGemmCols = 64, kGemmK = 32, kGemmThreads = 256;
constexpr int kColsPerThread = kGemmCols / (kGemmThreads / kGemmRows);

__global__ void __launch_bounds__(kGemmThreads) head_gemm_kernel(const HeadGemm g) {
  __shared__ float x_s[kGemmRows][kGemmK + 1];
  __shared__ float w_s[kGemmK][kGemmCols + 1];
  const int n0 = static_cast<int>(blockIdx.x) * kGemmCols, head = static_cast<int>(blockIdx.y);
  const int t0 = static_cast<int>(blockIdx.z) * kGemmRows;
  const int row = static_cast<int>(threadIdx.x) / (kGemmThreads / kGemmRows);
  const int col = static_cast<int>(threadIdx.x) % (kGemmThreads / kGemmRows);
  const int64_t w_row0 = head * g.w_rows_per_head + g.w_first_row;
  float acc[kColsPerThread] = {};
  for (int k0 = 0; k0 < g.k; k0 += kGemmK) {
    for (int i = threadIdx.x; i < kGemmRows * kGemmK; i += kGemmThreads) {
      const int r = i / kGemmK, kk = i % kGemmK;
      const int t = t0 + r, k = k0 + kk;
      x_s[r][kk] = t < g.rows && k < g.k
                       ? load_as_float(g.x, g.x_dtype, (int64_t{t} * g.heads + head) * g.x_head_stride + k)
                       : 0.0f;
    }
    for (int i = threadIdx.x; i < kGemmK * kGemmCols; i += kGemmThreads) {
      // Consecutive threads read consecutive elements of w in either orientation.
      const int kk = g.transposed ? i % kGemmK : i / kGemmCols;
      const int nn = g.transposed ? i / kGemmK : i % kGemmCols;
      const int k = k0 + kk, n = n0 + nn;
      float v = 0.0f;
      if (k < g.k && n < g.n)
        v = load_as_float(g.w, g.w_dtype, g.transposed ? (w_row0 + n) * g.w_cols + k : (w_row0 + k) * g.w_cols + n);
      w_s[kk][nn] = v;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kGemmK; ++kk) {
      const float x = x_s[row][kk];
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) acc[j] += x * w_s[kk][col + j * (kGemmThreads / kGemmRows)];
    }
    __syncthreads();
  }
  const int t = t0 + row;
  if (t >= g.rows) return;
#pragma unroll
  for (int j = 0; j < kColsPerThread; ++j) {
    const int n = n0 + col + j * (kGemmThreads / kGemmRows);
    if (n < g.n) store_from_float(g.y, g.y_dtype, (int64_t{t} * g.heads + head) * g.y_head_stride + n, acc[j]);
  }
}

}  // namespace

void head_gemm(const HeadGemm& g) {
  if (g.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(launch::ceil_div(g.n, kGemmCols)), static_cast<unsigned>(g.heads),
                  static_cast<unsigned>(launch::ceil_div(g.rows, kGemmRows)));
  head_gemm_kernel<<<grid, kGemmThreads, 0, CudaContext::current().stream()>>>(g);
  SE_CUDA_CHECK_LAUNCH("head_gemm_kernel");
}

void rope_latent_heads(TensorView out, TensorView x, TensorView positions, const RopeParams& rope,
                       const TensorView* norm_weight, float eps) {
  const int64_t tokens = x.shape[0];
  if (tokens == 0) return;
  SE_CHECK(rope.rotary_dim <= kMaxRopeDim, "cuda::rope_latent_heads: a RoPE part of {} (at most {})", rope.rotary_dim,
           kMaxRopeDim);
  LatentHeadsArgs args{};
  args.x = x.data;
  args.x_dtype = x.dtype;
  args.out = out.data;
  args.out_dtype = out.dtype;
  args.positions = positions.ptr<int32_t>();
  args.norm_weight = norm_weight != nullptr ? norm_weight->ptr<float>() : nullptr;
  args.eps = eps;
  args.heads = static_cast<int32_t>(x.shape[1]);
  args.rope_dim = rope.rotary_dim;
  args.first = static_cast<int32_t>(x.shape[2]) - rope.rotary_dim;
  args.attention_factor = rope.attention_factor;
  cpu::rope_inv_freq(rope, args.inv_freq);
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(args.heads));
  const size_t smem = static_cast<size_t>(x.shape[2]) * sizeof(float);
  rope_latent_heads_kernel<<<grid, kRopeThreads, smem, CudaContext::current().stream()>>>(args);
  SE_CUDA_CHECK_LAUNCH("rope_latent_heads_kernel");
}

void absorb_latent_queries(TensorView q_latent, TensorView q, TensorView kv_b) {
  const int64_t rows = q.shape[0], heads = q.shape[1], rank = kv_b.shape[1];
  const int64_t rope_dim = q_latent.shape[2] - rank, nope = q.shape[2] - rope_dim;
  if (rows == 0) return;
  HeadGemm g{};
  g.x = q.data;
  g.x_dtype = q.dtype;
  g.x_head_stride = q.shape[2];
  g.y = q_latent.data;
  g.y_dtype = q_latent.dtype;
  g.y_head_stride = q_latent.shape[2];
  g.w = kv_b.data;
  g.w_dtype = kv_b.dtype;
  g.w_cols = rank;
  g.w_rows_per_head = kv_b.shape[0] / heads;
  g.w_first_row = 0;  // head h's W_uk: its first nope rows
  g.transposed = false;
  g.rows = static_cast<int32_t>(rows);
  g.heads = static_cast<int32_t>(heads);
  g.k = static_cast<int32_t>(nope);
  g.n = static_cast<int32_t>(rank);
  head_gemm(g);
  const int64_t n = rows * heads * rope_dim;
  copy_rope_parts_kernel<<<launch::grid_for(n, 256), 256, 0, CudaContext::current().stream()>>>(
      q_latent.data, q_latent.dtype, q.data, q.dtype, rows * heads, static_cast<int>(nope), static_cast<int>(rope_dim),
      static_cast<int>(rank));
  SE_CUDA_CHECK_LAUNCH("copy_rope_parts_kernel");
}

}  // namespace se::cuda
