// CUDA twins of Quest's page-bound ops (the CPU reference is backend/cpu/page_key_bounds.cpp). Both
// take the cache's host view over the device pool: the host walks the tables and stages what the
// kernel reads (host_tables.h). Bounds are the exact fp32 min / max of the bf16 keys, so they equal
// the CPU's over the same values; the scores differ from the CPU's only in summation order.
#include <cuda_bf16.h>

#include <cub/cub.cuh>

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
constexpr int kSelectThreads = 512;

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

// A float's bits as an unsigned key that orders like the float (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// One block per KV head. keys (scratch [num_kv_heads][max_pages]) takes the group-reduced score of every page but
// the last; a most-significant-digit radix select (four 8-bit passes of a shared histogram) finds the key of the
// (budget - 1)-th best; a block scan in page order then writes the pages above it and the lowest-numbered of those
// equal to it, so the list comes out ascending, and the last page closes it.
__global__ void select_top_pages_kernel(int32_t* selected, int selected_stride, int32_t* num_selected, uint32_t* keys,
                                        const float* head_scores, const int32_t* tables, int group, int max_pages,
                                        int page_budget, GroupReduce reduce) {
  using BlockScan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename BlockScan::TempStorage scan;
  __shared__ int histogram[256];
  __shared__ uint32_t threshold_s;
  __shared__ int remaining_s;
  const int h = blockIdx.x;
  const int32_t num_pages = tables[h + 1] - tables[h];
  int32_t* out = selected + static_cast<int64_t>(h) * selected_stride;
  if (num_pages <= page_budget) {
    for (int p = threadIdx.x; p < num_pages; p += kSelectThreads) out[p] = p;
    if (threadIdx.x == 0) num_selected[h] = num_pages;
    return;
  }
  if (page_budget == 1) {  // the last page alone
    if (threadIdx.x == 0) {
      out[0] = num_pages - 1;
      num_selected[h] = 1;
    }
    return;
  }
  const int32_t num_candidates = num_pages - 1;
  uint32_t* key = keys + static_cast<int64_t>(h) * max_pages;
  for (int p = threadIdx.x; p < num_candidates; p += kSelectThreads) {
    const float* score = head_scores + static_cast<int64_t>(h) * group * max_pages + p;
    float acc = score[0];
    for (int g = 1; g < group; ++g) {
      const float v = score[static_cast<int64_t>(g) * max_pages];
      acc = reduce == GroupReduce::kMax ? fmaxf(acc, v) : acc + v;
    }
    key[p] = order_key(reduce == GroupReduce::kMean ? acc / static_cast<float>(group) : acc);
  }
  uint32_t prefix = 0;
  uint32_t mask = 0;
  int remaining = page_budget - 1;  // keys still to take at or below the prefix found so far
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kSelectThreads) histogram[d] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < num_candidates; p += kSelectThreads)
      if ((key[p] & mask) == prefix) atomicAdd(&histogram[(key[p] >> shift) & 0xFFu], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0;
      for (int d = 255; d >= 0; --d) {
        if (above + histogram[d] >= remaining) {
          threshold_s = prefix | (static_cast<uint32_t>(d) << shift);
          remaining_s = remaining - above;
          break;
        }
        above += histogram[d];
      }
    }
    __syncthreads();
    prefix = threshold_s;
    remaining = remaining_s;
    mask |= 0xFFu << shift;
  }
  int written = 0;
  int equal_seen = 0;
  for (int first = 0; first < num_candidates; first += kSelectThreads) {
    const int p = first + static_cast<int>(threadIdx.x);
    const uint32_t k = p < num_candidates ? key[p] : 0u;
    const int equal = p < num_candidates && k == prefix ? 1 : 0;
    int equal_rank = 0, equal_total = 0;
    BlockScan(scan).ExclusiveSum(equal, equal_rank, equal_total);
    __syncthreads();
    const int take = (p < num_candidates && k > prefix) || (equal && equal_seen + equal_rank < remaining) ? 1 : 0;
    int position = 0, taken = 0;
    BlockScan(scan).ExclusiveSum(take, position, taken);
    __syncthreads();
    if (take) out[written + position] = p;
    written += taken;
    equal_seen += equal_total;
  }
  if (threadIdx.x == 0) {
    out[page_budget - 1] = num_pages - 1;
    num_selected[h] = page_budget;
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

namespace {

// Enqueues the bound scores of sequence `seq` into scratch: [H, max_pages] F32 after the staged tables (page_offset
// [num_kv_heads + 1], then each head's page ids), with extra_bytes of further scratch after the scores.
struct StagedBoundScores {
  float* scores;
  const int32_t* tables;
  void* extra;
};
StagedBoundScores enqueue_bound_scores(TensorView q, TensorView bounds, const AttentionView& view, int32_t seq,
                                       int max_pages, size_t extra_bytes) {
  const SeqKvView& sv = view.seqs[seq];
  const int32_t num_kv_heads = view.num_kv_heads;
  const int group = static_cast<int>(q.shape[0] / num_kv_heads);
  thread_local std::vector<int32_t> tables;
  tables.assign(static_cast<size_t>(num_kv_heads) + 1, 0);
  for (int32_t h = 0; h < num_kv_heads; ++h) {
    const int32_t num_pages =
        std::min((sv.num_tokens[h] + view.page_size - 1) / view.page_size, max_pages);
    const int32_t* pages = sv.page_ids + static_cast<int64_t>(h) * sv.stride;
    tables.insert(tables.end(), pages, pages + num_pages);
    tables[static_cast<size_t>(h) + 1] = tables[static_cast<size_t>(h)] + num_pages;
  }
  const size_t score_bytes = (static_cast<size_t>(q.shape[0]) * max_pages * sizeof(float) + 15) / 16 * 16;
  const StagedTables staged =
      stage_host_tables(tables.data(), tables.size() * sizeof(int32_t), score_bytes + extra_bytes);
  const size_t smem = static_cast<size_t>(group) * view.head_dim * sizeof(float);
  SE_CHECK(smem <= 48 * 1024, "cuda page-bound scores: a query group of {} x {} exceeds 48 KB", group,
           view.head_dim);
  const dim3 grid(static_cast<unsigned>((max_pages + kScoreWarps * kPagesPerWarp - 1) /
                                        (kScoreWarps * kPagesPerWarp)),
                  static_cast<unsigned>(num_kv_heads));
  auto* scores = static_cast<float*>(staged.results);
  page_key_bound_scores_kernel<<<grid, kScoreWarps * 32, smem, CudaContext::current().stream()>>>(
      scores, q.data, q.dtype, bounds.ptr<float>(), static_cast<const int32_t*>(staged.tables), num_kv_heads,
      group, view.head_dim, max_pages);
  SE_CUDA_CHECK_LAUNCH("page_key_bound_scores_kernel");
  return {scores, static_cast<const int32_t*>(staged.tables), static_cast<char*>(staged.results) + score_bytes};
}

}  // namespace

void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view,
                           int32_t seq) {
  if (out.numel() == 0) return;
  const auto max_pages = static_cast<int>(out.shape[1]);
  const StagedBoundScores staged = enqueue_bound_scores(q, bounds, view, seq, max_pages, 0);
  fetch_results(out.data, staged.scores, static_cast<size_t>(out.numel()) * sizeof(float));
}

void select_pages_by_key_bounds(TensorView selected, TensorView num_selected, TensorView q, TensorView bounds,
                                const AttentionView& view, int32_t seq, int32_t page_budget, GroupReduce reduce) {
  const SeqKvView& sv = view.seqs[seq];
  int32_t max_pages = 0;
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    max_pages = std::max(max_pages, (sv.num_tokens[h] + view.page_size - 1) / view.page_size);
  if (max_pages == 0) {
    SE_CUDA_CHECK(cudaMemsetAsync(num_selected.data, 0, num_selected.nbytes(), CudaContext::current().stream()));
    return;
  }
  const size_t key_bytes = static_cast<size_t>(view.num_kv_heads) * max_pages * sizeof(uint32_t);
  const StagedBoundScores staged = enqueue_bound_scores(q, bounds, view, seq, max_pages, key_bytes);
  select_top_pages_kernel<<<static_cast<unsigned>(view.num_kv_heads), kSelectThreads, 0,
                            CudaContext::current().stream()>>>(
      selected.ptr<int32_t>(), static_cast<int>(selected.shape[1]), num_selected.ptr<int32_t>(),
      static_cast<uint32_t*>(staged.extra), staged.scores, staged.tables,
      static_cast<int>(q.shape[0] / view.num_kv_heads), max_pages, page_budget, reduce);
  SE_CUDA_CHECK_LAUNCH("select_top_pages_kernel");
}

}  // namespace se::cuda
