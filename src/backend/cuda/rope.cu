#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
constexpr int kMaxHeadDim = 512;
constexpr int kWarps = 8;

// The inverse frequencies travel as a kernel parameter: no device table to keep in sync with
// RopeParams.
struct InvFreq {
  float value[kMaxHeadDim / 2];
};

// One token's heads laid out q | k | v in a row of `src` (heads of head_dim elements), copied to q, k and v
// ([T, heads, head_dim] each); q and k heads optionally RMS-normed, then rotated. v_heads = 0 and src == q is
// plain in-place RoPE.
struct HeadsArgs {
  const void* src;
  int64_t src_row;  // elements per token row of src
  void* q;
  void* k;
  void* v;
  DType dtype;  // of src, q, k and v
  int q_heads;
  int kv_heads;
  int v_heads;
  int head_dim;
  int half;  // rotary_dim / 2
  int64_t num_tokens;
  const int32_t* positions;
  const void* q_norm;  // nullptr: no per-head norm
  const void* k_norm;
  DType norm_dtype;
  float eps;
  float attention_factor;  // cos and sin scaled by it (YaRN; 1 otherwise)
  InvFreq inv_freq;
};

// One warp per (token, head), the head in registers (kPerLane elements a lane, all loads in flight at once):
// a decode step's few hundred heads cost one memory latency. The rotation pairs element i with i + half, which
// another lane holds, so the warp exchanges the head through shared memory. Same arithmetic as the CPU's
// rms_norm and rope: fp32 angle position * inv_freq, (a cos - b sin, b cos + a sin).
template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32) split_heads_rope_kernel(HeadsArgs a) {
  __shared__ float rows[kWarps][kPerLane * 32];
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int heads = a.q_heads + a.kv_heads + a.v_heads;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= a.num_tokens * heads) return;  // whole warps leave; no block-wide barrier follows
  const int64_t t = item / heads;
  const int h = static_cast<int>(item - t * heads);
  const int d = a.head_dim;
  float x[kPerLane];
  load_fragment(x, a.src, a.dtype, t * a.src_row + static_cast<int64_t>(h) * d, lane, 32, d);

  const bool is_q = h < a.q_heads;
  const bool is_k = !is_q && h < a.q_heads + a.kv_heads;
  void* dst = is_q ? a.q : is_k ? a.k : a.v;
  const int dst_heads = is_q ? a.q_heads : is_k ? a.kv_heads : a.v_heads;
  const int dst_head = is_q ? h : is_k ? h - a.q_heads : h - a.q_heads - a.kv_heads;
  const int64_t dst_base = (t * dst_heads + dst_head) * d;
  if (is_q || is_k) {
    const void* norm = is_q ? a.q_norm : a.k_norm;
    if (norm != nullptr) {
      float w[kPerLane];
      load_fragment(w, norm, a.norm_dtype, 0, lane, 32, d);
      float sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) sum_sq += x[j] * x[j];
      const float inv = rsqrtf(warp_sum(sum_sq) / static_cast<float>(d) + a.eps);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) x[j] = x[j] * inv * w[j];
    }
    float* row = rows[warp];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) row[lane + 32 * j] = x[j];
    __syncwarp();
    const float pos = static_cast<float>(a.positions[t]);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int i = lane + 32 * j;
      if (i >= 2 * a.half) continue;
      const bool low = i < a.half;
      float sin_v, cos_v;
      sincosf(pos * a.inv_freq.value[low ? i : i - a.half], &sin_v, &cos_v);
      cos_v *= a.attention_factor;
      sin_v *= a.attention_factor;
      x[j] = low ? x[j] * cos_v - row[i + a.half] * sin_v : x[j] * cos_v + row[i - a.half] * sin_v;
    }
  }
  store_fragment(dst, a.dtype, dst_base, lane, 32, d, x);
}

void launch_heads(HeadsArgs& a, const RopeParams& params) {
  SE_CHECK(a.head_dim <= kMaxHeadDim, "cuda::rope: head_dim {} over {}", a.head_dim, kMaxHeadDim);
  a.half = params.rotary_dim / 2;
  a.attention_factor = params.attention_factor;
  cpu::rope_inv_freq(params, a.inv_freq.value);
  const int64_t items = a.num_tokens * (a.q_heads + a.kv_heads + a.v_heads);
  if (items == 0) return;
  const auto blocks = static_cast<unsigned>(launch::ceil_div(items, kWarps));
  cudaStream_t stream = CudaContext::current().stream();
  if (a.head_dim <= 64) {
    split_heads_rope_kernel<2><<<blocks, kWarps * 32, 0, stream>>>(a);
  } else if (a.head_dim <= 128) {
    split_heads_rope_kernel<4><<<blocks, kWarps * 32, 0, stream>>>(a);
  } else if (a.head_dim <= 256) {
    split_heads_rope_kernel<8><<<blocks, kWarps * 32, 0, stream>>>(a);
  } else {
    split_heads_rope_kernel<16><<<blocks, kWarps * 32, 0, stream>>>(a);
  }
  SE_CUDA_CHECK_LAUNCH("split_heads_rope_kernel");
}
}  // namespace

void rope(TensorView x, TensorView positions, const RopeParams& params) {
  HeadsArgs a{};
  a.src = x.data;
  a.src_row = x.shape[1] * x.shape[2];
  a.q = x.data;
  a.dtype = x.dtype;
  a.q_heads = static_cast<int>(x.shape[1]);
  a.head_dim = static_cast<int>(x.shape[2]);
  a.num_tokens = x.shape[0];
  a.positions = positions.ptr<int32_t>();
  launch_heads(a, params);
}

void split_qkv_rope(TensorView q, TensorView k, TensorView v, TensorView qkv, TensorView positions,
                    const RopeParams& params, const QkNorm* qk_norm) {
  HeadsArgs a{};
  a.src = qkv.data;
  a.src_row = qkv.shape[1];
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.dtype = qkv.dtype;
  a.q_heads = static_cast<int>(q.shape[1]);
  a.kv_heads = static_cast<int>(k.shape[1]);
  a.v_heads = static_cast<int>(v.shape[1]);
  a.head_dim = static_cast<int>(q.shape[2]);
  a.num_tokens = q.shape[0];
  a.positions = positions.ptr<int32_t>();
  if (qk_norm != nullptr) {
    SE_CHECK(qk_norm->q_weight.dtype == qk_norm->k_weight.dtype, "cuda::split_qkv_rope: q and k norm dtypes");
    a.q_norm = qk_norm->q_weight.data;
    a.k_norm = qk_norm->k_weight.data;
    a.norm_dtype = qk_norm->q_weight.dtype;
    a.eps = qk_norm->eps;
  }
  launch_heads(a, params);
}

}  // namespace se::cuda
