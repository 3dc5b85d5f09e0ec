// Device buffers for the kernel benchmarks: reproducible random fills (a splitmix64 hash of the element
// index), small int32 tables uploaded from the host, and attention views over a pool of bf16 pages.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/attention_view.h"
#include "backend/cuda/cuda_allocator.h"
#include "tensor/tensor.h"

namespace se::bench {

// Uniform in [-1, 1) for element i under `seed`.
__device__ __forceinline__ float hashed_uniform(size_t i, uint64_t seed) {
  uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

// Unit-variance uniform bf16 values.
__global__ void fill_random_bf16_kernel(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16(hashed_uniform(i, seed) * 1.7320508f);
  }
}

inline Tensor device_i32(const std::vector<int32_t>& v) {
  Tensor host = Tensor::empty(DType::kI32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), host.data<int32_t>());
  return cuda::to_device(host);
}

// A view of `seqs` (page tables already on the device) over `pool`'s bf16 pages; the SeqKvView entries go to
// the device into `seqs_storage`, which keeps them alive. No selection.
inline AttentionView bf16_paged_view(void* pool, int page_size, int head_dim, int num_kv_heads,
                                     const Tensor& q_indptr, const std::vector<SeqKvView>& seqs,
                                     Tensor& seqs_storage) {
  const size_t bytes = sizeof(SeqKvView) * seqs.size();
  seqs_storage = Tensor::empty(DType::kU8, {static_cast<int64_t>(bytes)}, cuda::cuda_allocator());
  cuda::copy_bytes(seqs_storage.raw(), seqs.data(), bytes);
  AttentionView view;
  view.kv_base = pool;
  view.kv_dtype = DType::kBF16;
  view.page_bytes = size_t{2} * page_size * head_dim * 2;  // K and V
  view.page_size = page_size;
  view.head_dim = head_dim;
  view.num_kv_heads = num_kv_heads;
  view.num_seqs = static_cast<int32_t>(seqs.size());
  view.q_indptr = q_indptr.data<int32_t>();
  view.seqs = static_cast<const SeqKvView*>(seqs_storage.raw());
  return view;
}

}  // namespace se::bench
