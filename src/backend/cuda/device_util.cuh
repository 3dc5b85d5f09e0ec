// Device-side helpers shared by the CUDA op kernels: element loads and stores by run-time dtype
// (the dtype is uniform across a launch, so the switch costs no divergence), warp reductions and
// launch arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/attention_view.h"
#include "tensor/dtype.h"

namespace se::cuda {

// The selected entries of KV head `kv_head` of sequence `slice`: the batch-wide produced lists when the view has
// them, else the sequence's own (entries null: no selection, every token).
struct SelectedEntries {
  const int32_t* entries;
  int32_t count;
};
__device__ __forceinline__ SelectedEntries selected_entries(const ProducedSelection& produced, const SeqKvView& sv,
                                                            int32_t slice, int32_t kv_head, int32_t num_kv_heads) {
  if (produced.lists != nullptr)
    return {produced.lists + slice * produced.seq_stride + static_cast<int64_t>(kv_head) * produced.head_stride,
            produced.counts[static_cast<int64_t>(slice) * num_kv_heads + kv_head]};
  if (sv.selected == nullptr) return {nullptr, 0};
  return {sv.selected + static_cast<int64_t>(kv_head) * sv.selected_stride, sv.num_selected[kv_head]};
}

__device__ __forceinline__ float load_as_float(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Rounds to nearest-even for BF16/F16, as the host conversions in tensor/dtype.h.
__device__ __forceinline__ void store_from_float(void* p, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
      break;
    case DType::kF16:
      static_cast<__half*>(p)[i] = __float2half(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
      break;
  }
}

// The value a store of `v` in `dtype` would read back.
__device__ __forceinline__ float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::kBF16:
      return __bfloat162float(__float2bfloat16(v));
    case DType::kF16:
      return __half2float(__float2half(v));
    default:
      return v;
  }
}

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

template <typename T, int N>
__device__ __forceinline__ void load_fragment_of(float (&v)[N], const T* src, int first, int step, int end) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int i = first + j * step;
    v[j] = i < end ? to_float(src[i]) : 0.0f;
  }
}

// A thread's fragment of one row: v[j] = p[base + first + j * step] as float, 0 past `end`. The dtype
// switch sits outside the loop, so all N loads are in flight before the first is used (a loop of
// dependent load_as_float calls would wait out one memory latency per element).
template <int N>
__device__ __forceinline__ void load_fragment(float (&v)[N], const void* p, DType dtype, int64_t base,
                                              int first, int step, int end) {
  switch (dtype) {
    case DType::kBF16:
      return load_fragment_of(v, static_cast<const __nv_bfloat16*>(p) + base, first, step, end);
    case DType::kF16:
      return load_fragment_of(v, static_cast<const __half*>(p) + base, first, step, end);
    default:
      return load_fragment_of(v, static_cast<const float*>(p) + base, first, step, end);
  }
}

// The store twin of load_fragment: p[base + first + j * step] = v[j] for the elements before `end`.
template <int N>
__device__ __forceinline__ void store_fragment(void* p, DType dtype, int64_t base, int first, int step, int end,
                                               const float (&v)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int i = first + j * step;
    if (i < end) store_from_float(p, dtype, base + i, v[j]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `partial` may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = static_cast<int>(blockDim.x) >> 5;
  v = lane < num_warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}

// The sequence a flattened query row belongs to: the last s with q_indptr[s] <= row (binary search).
__device__ __forceinline__ int seq_of_row(const int32_t* q_indptr, int num_seqs, int row) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (q_indptr[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace se::cuda

namespace se::cuda::launch {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = ceil_div(n, threads);
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

}  // namespace se::cuda::launch
