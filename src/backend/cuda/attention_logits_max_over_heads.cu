// CUDA twin of the filter-layer logits (the CPU reference is
// backend/cpu/attention_logits_max_over_heads.cpp). It takes the cache's host view over the device
// pool: the host stages every KV head's leading page ids (host_tables.h), a block takes 64 keys at
// a time across all KV heads and keeps their running max, and the result comes back to the host, or the
// indices of its k largest stay on the device (the filter layers' index), where token_lists_with_tail turns them into
// the sparse layers' lists.
// fp32 dots of the bf16 keys: only the summation order differs from the CPU's.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/block_top_k.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/host_tables.h"

namespace se::cuda {

namespace {
constexpr int kWarps = 8;
constexpr int kLanesPerKey = 4;
constexpr int kKeysPerBlock = kWarps * 32 / kLanesPerKey;  // 64

// A quad of lanes per key: lane r of the quad holds the 16-byte chunks r, r + 4, ... of the key's
// row, so a warp reads 8 rows in whole 64-byte runs, and two shuffles finish each dot product.
// q [H, D] (staged as f32 in shared memory); page_ids [num_kv_heads][pages_per_head];
// out [num_keys].
template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    attention_logits_max_over_heads_kernel(float* out, const void* q, DType q_dtype,
                                           const int32_t* page_ids, int pages_per_head,
                                           const char* kv_base, size_t page_bytes, int page_size,
                                           int num_kv_heads, int group, int num_keys, float scale) {
  constexpr int kChunksPerLane = D / 8 / kLanesPerKey;
  extern __shared__ float q_s[];  // [H][D]
  const int num_heads = num_kv_heads * group;
  for (int i = threadIdx.x; i < num_heads * D; i += blockDim.x)
    q_s[i] = load_as_float(q, q_dtype, i);
  __syncthreads();

  const int quad_lane = threadIdx.x % kLanesPerKey;
  for (int j0 = blockIdx.x * kKeysPerBlock; j0 < num_keys; j0 += gridDim.x * kKeysPerBlock) {
    const int j = j0 + threadIdx.x / kLanesPerKey;
    const bool valid = j < num_keys;  // invalid lanes still join the shuffles
    const int jj = valid ? j : num_keys - 1;
    const int32_t page_idx = jj / page_size;
    const int32_t offset = jj - page_idx * page_size;
    float best = -INFINITY;
    for (int kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
      const int32_t page = page_ids[static_cast<int64_t>(kv_head) * pages_per_head + page_idx];
      const auto* row = reinterpret_cast<const uint4*>(
          kv_base + static_cast<size_t>(page) * page_bytes + static_cast<size_t>(offset) * D * 2);
      float k[kChunksPerLane][8];
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        const uint4 raw = row[c * kLanesPerKey + quad_lane];
        const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(pairs[e]);
          k[c][2 * e] = f.x;
          k[c][2 * e + 1] = f.y;
        }
      }
      for (int g = 0; g < group; ++g) {
        const float* qh = q_s + (kv_head * group + g) * D;
        float dot = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunksPerLane; ++c) {
          const float4 a =
              *reinterpret_cast<const float4*>(qh + (c * kLanesPerKey + quad_lane) * 8);
          const float4 b =
              *reinterpret_cast<const float4*>(qh + (c * kLanesPerKey + quad_lane) * 8 + 4);
          dot += a.x * k[c][0] + a.y * k[c][1] + a.z * k[c][2] + a.w * k[c][3] + b.x * k[c][4] +
                 b.y * k[c][5] + b.z * k[c][6] + b.w * k[c][7];
        }
        dot += __shfl_xor_sync(0xffffffffu, dot, 1);
        dot += __shfl_xor_sync(0xffffffffu, dot, 2);
        best = fmaxf(best, dot * scale);
      }
    }
    if (valid && quad_lane == 0) out[j] = best;
  }
}

template <int D>
void launch_logits(float* result, TensorView q, const int32_t* page_ids, int pages_per_head,
                   const AttentionView& view, int group, int num_keys, float scale) {
  const size_t smem = static_cast<size_t>(q.shape[0]) * D * sizeof(float);
  static int configured_bytes = 48 * 1024;  // the default limit of dynamic shared memory
  if (static_cast<int>(smem) > configured_bytes) {
    SE_CUDA_CHECK(cudaFuncSetAttribute(attention_logits_max_over_heads_kernel<D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    configured_bytes = static_cast<int>(smem);
  }
  // One wave of blocks, each looping over key tiles: the query staging is paid once per block.
  const int64_t tiles = (num_keys + kKeysPerBlock - 1) / kKeysPerBlock;
  const auto blocks = static_cast<unsigned>(
      std::min<int64_t>(tiles, int64_t{8} * CudaContext::current().props().multiProcessorCount));
  attention_logits_max_over_heads_kernel<D>
      <<<blocks, kWarps * 32, smem, CudaContext::current().stream()>>>(
          result, q.data, q.dtype, page_ids, pages_per_head, static_cast<const char*>(view.kv_base),
          view.page_bytes, view.page_size, view.num_kv_heads, group, num_keys, scale);
  SE_CUDA_CHECK_LAUNCH("attention_logits_max_over_heads_kernel");
}

// Enqueues the logits of sequence `slice`'s first num_keys tokens into device memory, with extra_bytes of scratch
// after them (16-byte aligned); returns the logits.
float* enqueue_logits(TensorView q, const AttentionView& view, int32_t slice, int num_keys, float scale,
                      size_t extra_bytes, void** extra) {
  SE_CHECK(
      reinterpret_cast<uintptr_t>(view.kv_base) % 16 == 0 && view.page_bytes % 16 == 0,
      "cuda::attention_logits_max_over_heads: the KV base and page_bytes must be 16-byte aligned");
  const SeqKvView& sv = view.seqs[slice];
  const int group = static_cast<int>(q.shape[0] / view.num_kv_heads);
  const int pages_per_head = (num_keys + view.page_size - 1) / view.page_size;
  // page_ids [num_kv_heads][pages_per_head]: the pages holding each head's first num_keys tokens.
  thread_local std::vector<int32_t> page_ids;
  page_ids.resize(static_cast<size_t>(view.num_kv_heads) * static_cast<size_t>(pages_per_head));
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    std::copy_n(sv.page_ids + static_cast<int64_t>(h) * sv.stride, pages_per_head,
                page_ids.begin() + static_cast<int64_t>(h) * pages_per_head);
  const size_t logit_bytes = (static_cast<size_t>(num_keys) * sizeof(float) + 15) / 16 * 16;
  const StagedTables staged =
      stage_host_tables(page_ids.data(), page_ids.size() * sizeof(int32_t), logit_bytes + extra_bytes);
  auto* logits = static_cast<float*>(staged.results);
  if (extra != nullptr) *extra = static_cast<char*>(staged.results) + logit_bytes;
  const auto* tables = static_cast<const int32_t*>(staged.tables);
  switch (view.head_dim) {
    case 64:
      launch_logits<64>(logits, q, tables, pages_per_head, view, group, num_keys, scale);
      break;
    case 128:
      launch_logits<128>(logits, q, tables, pages_per_head, view, group, num_keys, scale);
      break;
    case 256:
      launch_logits<256>(logits, q, tables, pages_per_head, view, group, num_keys, scale);
      break;
    default:
      SE_CHECK(false, "cuda::attention_logits_max_over_heads: head_dim {} (64, 128 or 256)",
               view.head_dim);
  }
  return logits;
}

constexpr int kTopKThreads = 1024;
constexpr int kTopKBatch = 16;

// Block b: the k largest of scores [b * chunk, min(n, (b + 1) * chunk)) as ascending indices into scores, at
// out + b * k (block_top_k.cuh). With one block, the whole row's top k.
__global__ void __launch_bounds__(kTopKThreads)
    chunk_top_k_kernel(int32_t* out, const float* scores, int n, int chunk, int k) {
  __shared__ BlockTopKStorage<kTopKThreads> storage;
  const int begin = blockIdx.x * chunk;
  const float* mine = scores + begin;
  int32_t* picked = out + blockIdx.x * k;
  block_top_k_ascending<kTopKThreads, kTopKBatch>(storage, picked, min(chunk, n - begin), k,
                                                  [mine](int i) { return order_key(mine[i]); });
  __syncthreads();
  for (int j = threadIdx.x; j < k && begin > 0; j += kTopKThreads) picked[j] += begin;
}

// The k largest among the scores of `candidates` (ascending indices into scores), as ascending indices.
__global__ void __launch_bounds__(kTopKThreads)
    candidates_top_k_kernel(int32_t* out, const float* scores, const int32_t* candidates, int n, int k) {
  __shared__ BlockTopKStorage<kTopKThreads> storage;
  block_top_k_ascending<kTopKThreads, kTopKBatch>(
      storage, out, n, k, [scores, candidates](int i) { return order_key(scores[candidates[i]]); });
  __syncthreads();
  for (int j = threadIdx.x; j < k; j += kTopKThreads) out[j] = candidates[out[j]];
}

// Chunks for the two-level top k of n scores: about sqrt(n / k) of at least 2k each, which balances the chunks'
// selections (parallel, n / chunks keys each) against the final one over chunks * k candidates. Every chunk,
// the last included, then holds at least k keys.
int top_k_chunks(int n, int k) {
  const int balanced = static_cast<int>(std::lround(std::sqrt(static_cast<double>(n) / k)));
  return std::max(1, std::min({balanced, n / (2 * k), k + 1}));
}
}  // namespace

void attention_logits_max_over_heads(TensorView out, TensorView q, const AttentionView& view, int32_t slice,
                                     float scale) {
  const int num_keys = static_cast<int>(out.shape[0]);
  if (num_keys == 0) return;
  const float* logits = enqueue_logits(q, view, slice, num_keys, scale, 0, nullptr);
  fetch_results(out.data, logits, static_cast<size_t>(num_keys) * sizeof(float));
}

void top_keys_by_logits_max_over_heads(TensorView out_tokens, TensorView q, const AttentionView& view, int32_t slice,
                                       int32_t num_keys, float scale) {
  const int k = static_cast<int>(out_tokens.shape[0]);
  if (k == 0) return;
  // One block ranks a row alone on one SM; a long row goes to several blocks first, each keeping its chunk's top
  // k (a key of the row's top k is among its chunk's), and one block ranks their candidates.
  const int chunks = top_k_chunks(num_keys, k);
  void* candidates = nullptr;
  const float* logits = enqueue_logits(q, view, slice, num_keys, scale,
                                       chunks > 1 ? static_cast<size_t>(chunks) * k * sizeof(int32_t) : 0, &candidates);
  cudaStream_t stream = CudaContext::current().stream();
  if (chunks == 1) {
    chunk_top_k_kernel<<<1, kTopKThreads, 0, stream>>>(out_tokens.ptr<int32_t>(), logits, num_keys, num_keys, k);
    SE_CUDA_CHECK_LAUNCH("chunk_top_k_kernel");
    return;
  }
  const int chunk = (num_keys + chunks - 1) / chunks;
  chunk_top_k_kernel<<<chunks, kTopKThreads, 0, stream>>>(static_cast<int32_t*>(candidates), logits, num_keys,
                                                          chunk, k);
  SE_CUDA_CHECK_LAUNCH("chunk_top_k_kernel");
  candidates_top_k_kernel<<<1, kTopKThreads, 0, stream>>>(out_tokens.ptr<int32_t>(), logits,
                                                          static_cast<const int32_t*>(candidates), chunks * k, k);
  SE_CUDA_CHECK_LAUNCH("candidates_top_k_kernel");
}

namespace {
// Each KV head's stream length, passed by value (the tables are the host's).
struct TailLengths {
  static constexpr int kMaxHeads = 64;
  int32_t of[kMaxHeads];
};

// Block h writes KV head h's list: the shared tokens, then its tail; and its count.
__global__ void token_lists_with_tail_kernel(int32_t* lists, int64_t stride, int32_t* counts, const int32_t* tokens,
                                             int32_t k, int32_t tail_begin, TailLengths lengths) {
  const int h = blockIdx.x;
  const int32_t count = k + lengths.of[h] - tail_begin;
  int32_t* list = lists + h * stride;
  for (int32_t i = threadIdx.x; i < count; i += blockDim.x) list[i] = i < k ? tokens[i] : tail_begin + (i - k);
  if (threadIdx.x == 0) counts[h] = count;
}
}  // namespace

void token_lists_with_tail(TensorView lists, TensorView counts, TensorView tokens, const AttentionView& view,
                           int32_t slice, int32_t tail_begin) {
  SE_CHECK(view.num_kv_heads <= TailLengths::kMaxHeads, "cuda::token_lists_with_tail: {} KV heads, at most {}",
           view.num_kv_heads, TailLengths::kMaxHeads);
  TailLengths lengths{};
  std::copy_n(view.seqs[slice].num_tokens, view.num_kv_heads, lengths.of);
  token_lists_with_tail_kernel<<<view.num_kv_heads, 256, 0, CudaContext::current().stream()>>>(
      lists.ptr<int32_t>(), lists.shape[1], counts.ptr<int32_t>(), tokens.ptr<int32_t>(),
      static_cast<int32_t>(tokens.numel()), tail_begin, lengths);
  SE_CUDA_CHECK_LAUNCH("token_lists_with_tail_kernel");
}

}  // namespace se::cuda
