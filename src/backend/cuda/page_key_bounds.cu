// CUDA twins of Quest's page-bound ops (the CPU reference is backend/cpu/page_key_bounds.cpp). Both
// take the cache's host view over the device pool: the host walks the tables and stages what the
// kernel reads (host_tables.h). Bounds are the exact fp32 min / max of the bf16 keys, so they equal
// the CPU's over the same values; the scores differ from the CPU's only in summation order.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/host_tables.h"

namespace se::cuda {

namespace {
constexpr int kScoreWarps = 4;
constexpr int kPagesPerWarp = 8;

// One block per updated page: thread d folds dimension d of the page's first `count` keys.
// items [num_items] of (page id, tokens stored in it); bounds [num_pool_pages, 2, D].
__global__ void update_page_key_bounds_kernel(float* bounds, const int2* items, const char* kv_base,
                                              size_t page_bytes, int head_dim) {
  const int2 item = items[blockIdx.x];
  const auto* k =
      reinterpret_cast<const __nv_bfloat16*>(kv_base + static_cast<size_t>(item.x) * page_bytes);
  float* lo = bounds + static_cast<int64_t>(item.x) * 2 * head_dim;
  float* hi = lo + head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float mn = INFINITY, mx = -INFINITY;
#pragma unroll 8
    for (int t = 0; t < item.y; ++t) {
      const float x = __bfloat162float(k[static_cast<int64_t>(t) * head_dim + d]);
      mn = fminf(mn, x);
      mx = fmaxf(mx, x);
    }
    lo[d] = mn;
    hi[d] = mx;
  }
}

// grid (page blocks, num_kv_heads), kScoreWarps warps. The block stages its KV head's query group
// in shared memory; each warp takes pages of that head and reduces sum_d max(q*min, q*max) over the
// dimensions for every head of the group. tables: page_offset [num_kv_heads + 1] then the heads'
// page ids, concatenated. q [H, D]; out [H, max_pages].
__global__ void page_key_bound_scores_kernel(float* out, const void* q, DType q_dtype,
                                             const float* bounds, const int32_t* tables,
                                             int num_kv_heads, int group, int head_dim,
                                             int max_pages) {
  extern __shared__ float q_s[];  // [group][head_dim]
  const int kv_head = blockIdx.y;
  for (int i = threadIdx.x; i < group * head_dim; i += blockDim.x)
    q_s[i] = load_as_float(q, q_dtype, static_cast<int64_t>(kv_head) * group * head_dim + i);
  __syncthreads();
  const int32_t begin = tables[kv_head];
  const int32_t num_pages = tables[kv_head + 1] - begin;
  const int32_t* page_ids = tables + num_kv_heads + 1 + begin;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int first = (blockIdx.x * kScoreWarps + warp) * kPagesPerWarp;
  for (int p = first; p < min(first + kPagesPerWarp, max_pages); ++p) {
    float* dst = out + static_cast<int64_t>(kv_head) * group * max_pages + p;
    if (p >= num_pages) {
      for (int g = lane; g < group; g += 32) dst[static_cast<int64_t>(g) * max_pages] = -INFINITY;
      continue;
    }
    const float* lo = bounds + static_cast<int64_t>(page_ids[p]) * 2 * head_dim;
    const float* hi = lo + head_dim;
    for (int g = 0; g < group; ++g) {
      const float* qg = q_s + g * head_dim;
      float sum = 0.0f;
      for (int d = lane; d < head_dim; d += 32) sum += fmaxf(qg[d] * lo[d], qg[d] * hi[d]);
      sum = warp_sum(sum);
      if (lane == 0) dst[static_cast<int64_t>(g) * max_pages] = sum;
    }
  }
}
}  // namespace

void update_page_key_bounds(TensorView bounds, const AttentionView& view) {
  // The pages that received one of the batch's new tokens: the last n slots of every stream.
  thread_local std::vector<int32_t> items;  // (page id, tokens in it) pairs
  items.clear();
  for_each_page_with_new_tokens(view, [](int32_t page, int32_t num_stored) {
    items.push_back(page);
    items.push_back(num_stored);
  });
  const int64_t num_items = static_cast<int64_t>(items.size()) / 2;
  if (num_items == 0) return;
  SE_CHECK(num_items < (int64_t{1} << 31), "cuda::update_page_key_bounds: {} pages", num_items);
  const StagedTables staged = stage_host_tables(items.data(), items.size() * sizeof(int32_t), 0);
  const int threads = std::min(256, (view.head_dim + 31) / 32 * 32);
  update_page_key_bounds_kernel<<<static_cast<unsigned>(num_items), threads, 0,
                                  CudaContext::current().stream()>>>(
      bounds.ptr<float>(), static_cast<const int2*>(staged.tables),
      static_cast<const char*>(view.kv_base), view.page_bytes, view.head_dim);
  SE_CUDA_CHECK_LAUNCH("update_page_key_bounds_kernel");
}

void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds,
                           const AttentionView& view, int32_t seq) {
  const SeqKvView& sv = view.seqs[seq];
  const int32_t num_kv_heads = view.num_kv_heads;
  const int group = static_cast<int>(q.shape[0] / num_kv_heads);
  const int max_pages = static_cast<int>(out.shape[1]);
  if (out.numel() == 0) return;
  // tables: page_offset [num_kv_heads + 1], then each head's page ids (at most max_pages of them).
  thread_local std::vector<int32_t> tables;
  tables.assign(static_cast<size_t>(num_kv_heads) + 1, 0);
  for (int32_t h = 0; h < num_kv_heads; ++h) {
    const int32_t num_pages =
        std::min((sv.num_tokens[h] + view.page_size - 1) / view.page_size, max_pages);
    const int32_t* pages = sv.page_ids + static_cast<int64_t>(h) * sv.stride;
    tables.insert(tables.end(), pages, pages + num_pages);
    tables[static_cast<size_t>(h) + 1] = tables[static_cast<size_t>(h)] + num_pages;
  }
  const size_t result_bytes = static_cast<size_t>(out.numel()) * sizeof(float);
  const StagedTables staged =
      stage_host_tables(tables.data(), tables.size() * sizeof(int32_t), result_bytes);
  const size_t smem = static_cast<size_t>(group) * view.head_dim * sizeof(float);
  SE_CHECK(smem <= 48 * 1024, "cuda::page_key_bound_scores: a query group of {} x {} exceeds 48 KB",
           group, view.head_dim);
  const dim3 grid(static_cast<unsigned>((max_pages + kScoreWarps * kPagesPerWarp - 1) /
                                        (kScoreWarps * kPagesPerWarp)),
                  static_cast<unsigned>(num_kv_heads));
  auto* result = static_cast<float*>(staged.results);
  page_key_bound_scores_kernel<<<grid, kScoreWarps * 32, smem, CudaContext::current().stream()>>>(
      result, q.data, q.dtype, bounds.ptr<float>(), static_cast<const int32_t*>(staged.tables),
      num_kv_heads, group, view.head_dim, max_pages);
  SE_CUDA_CHECK_LAUNCH("page_key_bound_scores_kernel");
  fetch_results(out.data, result, result_bytes);
}

}  // namespace se::cuda
