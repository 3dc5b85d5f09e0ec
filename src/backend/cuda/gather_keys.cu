// CUDA twin of gather_keys (the CPU reference is backend/cpu/gather_keys.cpp): the cache's host tables over the
// device pool; the host stages the page ids that hold each KV head's slots [first_slot, first_slot + n), and one
// block per (slot, KV head) converts the bf16 key row to f32 in out [n, Hkv, D]. An exact copy.
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/host_tables.h"

namespace se::cuda {

namespace {

// page_ids [num_kv_heads][pages_per_head]: the pages from slot first_slot's on.
__global__ void gather_keys_kernel(float* out, const int32_t* page_ids, int pages_per_head, const char* kv_base,
                                   size_t page_bytes, int page_size, int num_kv_heads, int head_dim, int first_slot) {
  const int t = blockIdx.x, h = blockIdx.y;
  const int slot = first_slot + t;
  const int page_index = slot / page_size - first_slot / page_size;
  const int32_t page = page_ids[static_cast<int64_t>(h) * pages_per_head + page_index];
  const auto* row = reinterpret_cast<const __nv_bfloat16*>(kv_base + static_cast<size_t>(page) * page_bytes) +
                    static_cast<int64_t>(slot % page_size) * head_dim;  // K comes first in a page
  float* dst = out + (static_cast<int64_t>(t) * num_kv_heads + h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = __bfloat162float(row[d]);
}

}  // namespace

void gather_keys(TensorView out, const AttentionView& view, int32_t slice, int32_t first_slot) {
  const auto n = static_cast<int32_t>(out.shape[0]);
  const SeqKvView& sv = view.seqs[slice];
  const int32_t first_page = first_slot / view.page_size;
  const int32_t pages_per_head = (first_slot + n - 1) / view.page_size - first_page + 1;
  thread_local std::vector<int32_t> page_ids;
  page_ids.resize(static_cast<size_t>(view.num_kv_heads) * static_cast<size_t>(pages_per_head));
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    for (int32_t p = 0; p < pages_per_head; ++p)
      page_ids[static_cast<size_t>(h) * pages_per_head + p] = sv.page_ids[int64_t{h} * sv.stride + first_page + p];
  const StagedTables staged = stage_host_tables(page_ids.data(), page_ids.size() * sizeof(int32_t), 0);
  gather_keys_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(view.num_kv_heads)), 128, 0,
                       CudaContext::current().stream()>>>(out.ptr<float>(), static_cast<const int32_t*>(staged.tables),
                                                          pages_per_head, static_cast<const char*>(view.kv_base),
                                                          view.page_bytes, view.page_size, view.num_kv_heads,
                                                          view.head_dim, first_slot);
  SE_CUDA_CHECK_LAUNCH("gather_keys_kernel");
}

}  // namespace se::cuda
