// write_kv on the GPU: the step's new K/V rows into the slots the cache appended, as bf16 elements, or as e4m3
// codes under the KV head's scale for the FP8 store (the bytes the CPU's fp8_quantize writes for the same values).
// A shared-latent store's pages have no V half: its rows go to the K half alone.
#include <cuda_bf16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/fp8_e4m3.cuh"

namespace se::cuda {

namespace {
struct WriteKvArgs {
  char* kv_base;
  size_t page_bytes;
  int32_t page_size, head_dim, num_kv_heads, num_seqs;
  const int32_t* q_indptr;
  const SeqKvView* seqs;
  const void* k;
  const void* v;
  DType dtype;            // of k and v
  const float* k_scales;  // FP8 pages: [num_kv_heads] (device); null for bf16 pages
  const float* v_scales;
  int32_t halves;  // 2 (K and V), or 1 for the shared latent's rows
};

// One block per batch row; each thread moves 8 elements (one 16-byte BF16 chunk, or 8 codes) of K and
// of V of one KV head into the slot the cache appended for this row: num_tokens[h] - n + r.
__global__ void write_kv_kernel(WriteKvArgs a) {
  const int row = blockIdx.x;
  const int s = seq_of_row(a.q_indptr, a.num_seqs, row);
  const int32_t n = a.q_indptr[s + 1] - a.q_indptr[s];
  const int32_t r = row - a.q_indptr[s];
  const SeqKvView sv = a.seqs[s];
  const int chunks_per_head = a.head_dim / 8;
  for (int u = threadIdx.x; u < a.num_kv_heads * chunks_per_head; u += blockDim.x) {
    const int h = u / chunks_per_head;
    const int c = u - h * chunks_per_head;
    const int32_t slot = sv.num_tokens[h] - n + r;
    const int32_t page = sv.page_ids[static_cast<int64_t>(h) * sv.stride + slot / a.page_size];
    const int32_t offset = slot % a.page_size;
    char* page_base = a.kv_base + static_cast<size_t>(page) * a.page_bytes;
    const int64_t src = (static_cast<int64_t>(row) * a.num_kv_heads + h) * a.head_dim + c * 8;
    for (int kv = 0; kv < a.halves; ++kv) {
      const void* from = kv == 0 ? a.k : a.v;
      const size_t element = (static_cast<size_t>(kv) * a.page_size + offset) * a.head_dim + c * 8;
      if (a.k_scales != nullptr) {
        // The CPU's fp8_quantize: code = e4m3_satfinite(x / scale), the division IEEE as on the host.
        const float scale = (kv == 0 ? a.k_scales : a.v_scales)[h];
        alignas(8) uint8_t codes[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) codes[i] = fp8_e4m3_code(load_as_float(from, a.dtype, src + i) / scale);
        *reinterpret_cast<uint2*>(page_base + element) = *reinterpret_cast<const uint2*>(codes);
        continue;
      }
      alignas(16) __nv_bfloat16 chunk[8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
        chunk[i] = __float2bfloat16(load_as_float(from, a.dtype, src + i));
      *reinterpret_cast<uint4*>(page_base + element * sizeof(__nv_bfloat16)) = *reinterpret_cast<const uint4*>(chunk);
    }
  }
}
}  // namespace

void write_kv(const AttentionView& view, TensorView k, TensorView v) {
  const int64_t num_rows = k.shape[0];
  if (num_rows == 0) return;
  SE_CHECK(view.head_dim % 8 == 0 && view.page_bytes % 16 == 0,
           "cuda::write_kv: head_dim {} page_bytes {}", view.head_dim, view.page_bytes);
  const bool fp8 = view.payload == KvPayload::kQuantized;  // ops.cpp admits no other quantized store here
  const WriteKvArgs args{static_cast<char*>(view.kv_base),
                         view.page_bytes,
                         view.page_size,
                         view.head_dim,
                         view.num_kv_heads,
                         view.num_seqs,
                         view.q_indptr,
                         view.seqs,
                         k.data,
                         v.data,
                         k.dtype,
                         fp8 ? view.quantized.k_scales : nullptr,
                         fp8 ? view.quantized.v_scales : nullptr,
                         view.payload == KvPayload::kSharedLatent ? 1 : 2};
  write_kv_kernel<<<static_cast<unsigned>(num_rows), 128, 0, CudaContext::current().stream()>>>(
      args);
  SE_CUDA_CHECK_LAUNCH("write_kv_kernel");
}

}  // namespace se::cuda
