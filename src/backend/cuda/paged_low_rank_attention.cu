// Attention over low-rank KV latents (attention_view.h, kLowRankLatent) on the GPU, the twin of the CPU op:
// one CTA per (query row, KV head). For each visible key the CTA loads the token's latent row, rebuilds the key in
// shared memory (up_k, bias, RMS norm, RoPE at the slot: the CPU's arithmetic), and every warp scores it for its
// query heads with an online softmax, summing the value latents; up_v then expands each head's sum. fp32 math over
// bf16 pages, keys visited one at a time: the exact cross-check a faster kernel would be held to.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {
constexpr int kWarps = 4;
constexpr int kHeadsPerWarp = 4;  // query heads per KV head: at most kWarps * kHeadsPerWarp
constexpr int kMaxDim = 256;      // head_dim, k_rank and v_rank
constexpr int kPerLane = kMaxDim / 32;

struct LowRankArgs {
  const void* q;
  DType q_dtype;
  void* out;
  DType out_dtype;
  const char* kv_base;
  size_t page_bytes;
  int32_t page_size, num_seqs, num_heads, queries_per_kv, window;
  const int32_t* q_indptr;
  const SeqKvView* seqs;
  LatentKvView lr;
  float scale, softcap, attention_factor;
  int32_t half;
  float inv_freq[kMaxDim / 2];
};

__global__ void __launch_bounds__(kWarps * 32) paged_low_rank_attention_kernel(const LowRankArgs a) {
  __shared__ float latent[kMaxDim * 2];
  __shared__ float key[kMaxDim];
  __shared__ float rotated[kMaxDim];
  __shared__ float sums[kWarps * kHeadsPerWarp][kMaxDim];
  const int row = blockIdx.x, kv_head = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const LatentKvView& lr = a.lr;
  const int d_head = lr.kv_head_dim, width = lr.k_rank + lr.v_rank;
  const int group = kv_head / lr.group_heads;
  const int64_t first_row = static_cast<int64_t>(kv_head) * d_head;  // == (group * group_heads + head) * D

  const int s = seq_of_row(a.q_indptr, a.num_seqs, row);
  const SeqKvView sv = a.seqs[s];
  const int32_t n = a.q_indptr[s + 1] - a.q_indptr[s];
  const int32_t last = sv.num_tokens[group] - n + (row - a.q_indptr[s]);
  const int32_t first = a.window > 0 ? max(0, last - a.window + 1) : 0;
  const int32_t* pages = sv.page_ids + static_cast<int64_t>(group) * sv.stride;

  float q[kHeadsPerWarp][kPerLane], acc[kHeadsPerWarp][kPerLane], m[kHeadsPerWarp], l[kHeadsPerWarp];
#pragma unroll
  for (int g = 0; g < kHeadsPerWarp; ++g) {
    const int head = warp * kHeadsPerWarp + g;
    const int64_t base = (static_cast<int64_t>(row) * a.num_heads + kv_head * a.queries_per_kv + head) * d_head;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int d = lane + 32 * e;
      q[g][e] = head < a.queries_per_kv && d < d_head ? load_as_float(a.q, a.q_dtype, base + d) : 0.0f;
      acc[g][e] = 0.0f;
    }
    m[g] = -INFINITY;
    l[g] = 0.0f;
  }

  for (int32_t j = first; j <= last; ++j) {
    const auto* stored =
        reinterpret_cast<const __nv_bfloat16*>(a.kv_base + static_cast<size_t>(pages[j / a.page_size]) * a.page_bytes) +
        static_cast<size_t>(j % a.page_size) * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) latent[i] = __bfloat162float(stored[i]);
    __syncthreads();
    float square_sum = 0.0f;
    for (int d = threadIdx.x; d < d_head; d += blockDim.x) {
      const float* up = lr.up_k + (first_row + d) * lr.k_rank;
      float k = 0.0f;
      for (int r = 0; r < lr.k_rank; ++r) k += up[r] * latent[r];
      if (lr.k_bias != nullptr) k += lr.k_bias[first_row + d];
      key[d] = k;
      square_sum += k * k;
    }
    if (lr.k_norm != nullptr) {
      const float inv_rms = rsqrtf(block_sum(square_sum) / static_cast<float>(d_head) + lr.norm_eps);
      for (int d = threadIdx.x; d < d_head; d += blockDim.x) key[d] = key[d] * inv_rms * lr.k_norm[d];
    }
    __syncthreads();
    for (int d = threadIdx.x; d < d_head; d += blockDim.x) {
      if (d < 2 * a.half) {
        const int i = d < a.half ? d : d - a.half;
        float sin_v, cos_v;
        sincosf(static_cast<float>(j) * a.inv_freq[i], &sin_v, &cos_v);
        cos_v *= a.attention_factor;
        sin_v *= a.attention_factor;
        const float x = key[i], y = key[i + a.half];
        rotated[d] = d < a.half ? x * cos_v - y * sin_v : y * cos_v + x * sin_v;
      } else {
        rotated[d] = key[d];
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kHeadsPerWarp; ++g) {
      if (warp * kHeadsPerWarp + g >= a.queries_per_kv) break;
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int d = lane + 32 * e;
        if (d < d_head) dot += q[g][e] * rotated[d];
      }
      float score = warp_sum(dot) * a.scale;
      if (a.softcap > 0.0f) score = a.softcap * tanhf(score / a.softcap);
      const float m_new = fmaxf(m[g], score);
      const float alpha = expf(m[g] - m_new), p = expf(score - m_new);
      l[g] = l[g] * alpha + p;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int r = lane + 32 * e;
        acc[g][e] = acc[g][e] * alpha + (r < lr.v_rank ? p * latent[lr.k_rank + r] : 0.0f);
      }
      m[g] = m_new;
    }
    __syncthreads();  // the next key overwrites latent, key and rotated
  }

#pragma unroll
  for (int g = 0; g < kHeadsPerWarp; ++g) {
    const int head = warp * kHeadsPerWarp + g;
    if (head >= a.queries_per_kv) break;
    const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
    float* sum = sums[head];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e)
      if (lane + 32 * e < lr.v_rank) sum[lane + 32 * e] = acc[g][e] * inv;
    __syncwarp();
    const int64_t base = (static_cast<int64_t>(row) * a.num_heads + kv_head * a.queries_per_kv + head) * d_head;
    for (int d = lane; d < d_head; d += 32) {
      const float* up = lr.up_v + (first_row + d) * lr.v_rank;
      float o = 0.0f;
      if (l[g] > 0.0f) {
        for (int r = 0; r < lr.v_rank; ++r) o += up[r] * sum[r];
        if (lr.v_bias != nullptr) o += lr.v_bias[first_row + d];
      }
      store_from_float(a.out, a.out_dtype, base + d, o);
    }
  }
}
}  // namespace

void paged_low_rank_attention(TensorView out, TensorView q, const AttentionView& view, const RopeParams& rope,
                              const AttentionParams& params) {
  const int64_t num_rows = q.shape[0];
  if (num_rows == 0 || view.num_seqs == 0) return;
  const LatentKvView& lr = view.latent;
  const int kv_heads = view.num_kv_heads * lr.group_heads;
  const int num_heads = static_cast<int>(q.shape[1]);
  SE_CHECK(lr.kv_head_dim <= kMaxDim && lr.k_rank <= kMaxDim && lr.v_rank <= kMaxDim,
           "cuda::paged_low_rank_attention: head_dim {} and ranks {}, {} must be at most {}", lr.kv_head_dim, lr.k_rank,
           lr.v_rank, kMaxDim);
  SE_CHECK(num_heads / kv_heads <= kWarps * kHeadsPerWarp,
           "cuda::paged_low_rank_attention: {} query heads per KV head (at most {})", num_heads / kv_heads,
           kWarps * kHeadsPerWarp);
  LowRankArgs args{};
  args.q = q.data;
  args.q_dtype = q.dtype;
  args.out = out.data;
  args.out_dtype = out.dtype;
  args.kv_base = static_cast<const char*>(view.kv_base);
  args.page_bytes = view.page_bytes;
  args.page_size = view.page_size;
  args.num_seqs = view.num_seqs;
  args.num_heads = num_heads;
  args.queries_per_kv = num_heads / kv_heads;
  args.window = params.sliding_window;
  args.q_indptr = view.q_indptr;
  args.seqs = view.seqs;
  args.lr = lr;
  args.scale = params.scale;
  args.softcap = params.logit_softcap;
  args.attention_factor = rope.attention_factor;
  args.half = rope.rotary_dim / 2;
  cpu::rope_inv_freq(rope, args.inv_freq);
  const dim3 grid(static_cast<unsigned>(num_rows), static_cast<unsigned>(kv_heads));
  paged_low_rank_attention_kernel<<<grid, kWarps * 32, 0, CudaContext::current().stream()>>>(args);
  SE_CUDA_CHECK_LAUNCH("paged_low_rank_attention_kernel");
}

}  // namespace se::cuda
