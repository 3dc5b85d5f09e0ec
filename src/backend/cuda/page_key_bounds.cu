// CUDA twins of the page-bound ops (the CPU reference is backend/cpu/page_key_bounds.cpp). The
// kernels read the view's tables on the device: the cache's mirror as it is, a host view through a
// staged copy (host_tables.h). Launch sizes depend only on the batch shape and the caller's page
// capacity, never on the tables, so a decode step that ranks its pages can be replayed as a CUDA
// graph. Bounds are the min / max of the bf16 keys, kept in bf16 (exact, and half the bytes the ranking
// reads), so they equal the CPU's over the same values; the scores differ from the CPU's only in
// summation order.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "backend/cuda/block_top_k.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/host_tables.h"

namespace se::cuda {

namespace {
constexpr int kSelectThreads = 512;
// Candidates each selection thread loads at once: 8,192 per block, a 128K stream's pages in one batch.
constexpr int kSelectBatch = 16;

// grid (page chunks, num_kv_heads, num_seqs): the block walks the pages of its stream that hold one of the
// sequence's n new tokens (the last n slots), a chunk apart; thread d folds dimension d of each page's keys.
// bounds [num_pool_pages, 2, D] bf16, the keys' own type, so min and max stay exact.
__global__ void update_page_key_bounds_kernel(__nv_bfloat16* bounds, const int32_t* q_indptr, const SeqKvView* seqs,
                                              const char* kv_base, size_t page_bytes, int page_size, int head_dim) {
  const int s = blockIdx.z;
  const int h = blockIdx.y;
  const int32_t n = q_indptr[s + 1] - q_indptr[s];
  const SeqKvView sv = seqs[s];
  const int32_t len = sv.num_tokens[h];
  if (n == 0 || len == 0) return;
  const int32_t last = (len - 1) / page_size;
  for (int32_t p = (len > n ? len - n : 0) / page_size + static_cast<int32_t>(blockIdx.x); p <= last;
       p += static_cast<int32_t>(gridDim.x)) {
    const int32_t page = sv.page_ids[static_cast<int64_t>(h) * sv.stride + p];
    const int32_t count = min(page_size, len - p * page_size);
    const auto* k = reinterpret_cast<const __nv_bfloat16*>(kv_base + static_cast<size_t>(page) * page_bytes);
    __nv_bfloat16* lo = bounds + static_cast<int64_t>(page) * 2 * head_dim;
    __nv_bfloat16* hi = lo + head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
      float mn = INFINITY, mx = -INFINITY;
#pragma unroll 8
      for (int t = 0; t < count; ++t) {
        const float x = __bfloat162float(k[static_cast<int64_t>(t) * head_dim + d]);
        mn = fminf(mn, x);
        mx = fmaxf(mx, x);
      }
      lo[d] = __float2bfloat16(mn);
      hi[d] = __float2bfloat16(mx);
    }
  }
}

// Pages of the longest stream of a sequence.
__device__ __forceinline__ int32_t longest_stream_pages(const SeqKvView& sv, int num_kv_heads, int page_size) {
  int32_t most = 0;
  for (int h = 0; h < num_kv_heads; ++h) most = max(most, sv.num_tokens[h]);
  return (most + page_size - 1) / page_size;
}

// What the scoring kernel writes per page: the group's bounds summed (mean and sum divide the sum), their maximum,
// or every query head's own.
enum class BoundOutput { kGroupSum, kGroupMax, kPerHead };

// W = L / 2 words of L consecutive bf16 at p (8 bytes aligned for L = 4, 16 for L >= 8), undecoded.
template <int L>
__device__ __forceinline__ void load_bf16_words(uint32_t (&w)[L / 2], const __nv_bfloat16* p) {
  if constexpr (L % 8 == 0) {
#pragma unroll
    for (int i = 0; i < L / 8; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else {
    static_assert(L == 4);
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  }
}

// sum_i (q_pos[i] * hi[i] + q_neg[i] * lo[i]) over the L bf16 of lo / hi: max(q * lo, q * hi) is q * hi where q
// >= 0 and q * lo below, so the positive and negative parts of q pick the bound without a comparison.
template <int L>
__device__ __forceinline__ float bound_dot(const float (&q_pos)[L], const float (&q_neg)[L],
                                           const uint32_t (&lo)[L / 2], const uint32_t (&hi)[L / 2]) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < L / 2; ++i) {
    // A bf16 pair's first element is its low half; a bf16 is the top half of the float it equals.
    acc = fmaf(q_pos[2 * i], __uint_as_float(hi[i] << 16), acc);
    acc = fmaf(q_neg[2 * i], __uint_as_float(lo[i] << 16), acc);
    acc = fmaf(q_pos[2 * i + 1], __uint_as_float(hi[i] & 0xFFFF0000u), acc);
    acc = fmaf(q_neg[2 * i + 1], __uint_as_float(lo[i] & 0xFFFF0000u), acc);
  }
  return acc;
}

// x = p[0 .. L) (16-byte aligned shared memory).
template <int L>
__device__ __forceinline__ void load_floats(float (&x)[L], const float* p) {
#pragma unroll
  for (int i = 0; i < L; i += 4) {
    const float4 v = *reinterpret_cast<const float4*>(p + i);
    x[i] = v.x, x[i + 1] = v.y, x[i + 2] = v.z, x[i + 3] = v.w;
  }
}

// The sum over the 16 lanes of a half warp.
__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int offset = 8; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

constexpr int kScoreWarps = 4;
constexpr int kLanesPerPage = 16;  // a half warp reads one page's bounds, 16 bytes of each per lane at D = 128
constexpr int kScoreRows = 4;      // pages each half warp holds at once: a warp reads 8 pages per round
constexpr int kPagesPerWarp = 32;  // one page id per lane, loaded up front
constexpr int kScoreRounds = kPagesPerWarp / (2 * kScoreRows);
constexpr int kPagesPerBlock = kScoreWarps * kPagesPerWarp;

// grid (page blocks, num_kv_heads, num_seqs), kScoreWarps warps; scores sum_d max(q_d * min_d, q_d * max_d) of
// kPagesPerBlock pages of one stream per block. The block stages the positive and negative parts of its query
// group (from the sequence's last query row) in shared memory, summed over the group for kGroupSum, which makes a
// page's group sum one pass over its bounds. A warp takes 32 pages: lane l loads the id of page l first, then each
// round a half warp holds kScoreRows pages' bounds, lane j dimensions [j * L, j * L + L) of each. Every load is
// issued before its first use, so a round waits out one memory latency. out [num_seqs, rows, stride], rows =
// num_kv_heads (group outputs, the sum divided by `divisor`) or H (kPerHead). Pages past the head's stream (up to
// the sequence's longest) score -inf. q [T, H, D].
template <int D, BoundOutput kOut>
__global__ void __launch_bounds__(kScoreWarps * 32)
    page_key_bound_scores_kernel(float* out, int64_t stride, const void* q, DType q_dtype, const int32_t* q_indptr,
                                 const SeqKvView* seqs, const __nv_bfloat16* bounds, int num_kv_heads, int group,
                                 int page_size, float divisor) {
  constexpr int L = D / kLanesPerPage;
  constexpr int W = L / 2;
  // [heads][positive, negative][D]: one head (the group's sum) for kGroupSum, else the group's heads.
  extern __shared__ float q_s[];
  const int s = blockIdx.z;
  const int kv_head = blockIdx.y;
  if (q_indptr[s + 1] == q_indptr[s]) return;  // no query row to rank for
  const SeqKvView sv = seqs[s];
  // The caller's stride covers every stream it reads the ranking of; the clamp keeps the others inside the buffer.
  const auto seq_pages =
      static_cast<int32_t>(min(static_cast<int64_t>(longest_stream_pages(sv, num_kv_heads, page_size)), stride));
  const int32_t block_first = static_cast<int32_t>(blockIdx.x) * kPagesPerBlock;
  if (block_first >= seq_pages) return;
  const int32_t num_pages = (sv.num_tokens[kv_head] + page_size - 1) / page_size;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int32_t warp_first = block_first + warp * kPagesPerWarp;
  // Issued before the query's loads, so the two latencies overlap.
  const int32_t my_page =
      warp_first + lane < num_pages ? sv.page_ids[static_cast<int64_t>(kv_head) * sv.stride + warp_first + lane] : -1;

  const int num_heads = num_kv_heads * group;
  const int64_t q_first = (static_cast<int64_t>(q_indptr[s + 1] - 1) * num_heads + int64_t{kv_head} * group) * D;
  if constexpr (kOut == BoundOutput::kGroupSum) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float pos = 0.0f, neg = 0.0f;
      for (int g = 0; g < group; ++g) {
        const float x = load_as_float(q, q_dtype, q_first + int64_t{g} * D + d);
        pos += fmaxf(x, 0.0f);
        neg += fminf(x, 0.0f);
      }
      q_s[d] = pos;
      q_s[D + d] = neg;
    }
  } else {
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
      const float x = load_as_float(q, q_dtype, q_first + i);
      q_s[(i / D) * 2 * D + i % D] = fmaxf(x, 0.0f);
      q_s[(i / D) * 2 * D + D + i % D] = fminf(x, 0.0f);
    }
  }
  __syncthreads();

  const int half = lane >> 4;
  const int dim0 = (lane & 15) * L;
  const int64_t out_row = kOut == BoundOutput::kPerHead
                              ? static_cast<int64_t>(s) * num_heads + static_cast<int64_t>(kv_head) * group
                              : static_cast<int64_t>(s) * num_kv_heads + kv_head;
  // Lane 0 and lane 16 write their half's pages.
  const auto write = [&](int64_t row, int32_t page, float score) {
    if ((lane & 15) == 0 && page < seq_pages) out[row * stride + page] = page < num_pages ? score : -INFINITY;
  };
#pragma unroll 1
  for (int round = 0; round < kScoreRounds; ++round) {
    const int32_t first = warp_first + round * 2 * kScoreRows;
    if (first >= seq_pages) break;
    uint32_t lo[kScoreRows][W], hi[kScoreRows][W];
#pragma unroll
    for (int r = 0; r < kScoreRows; ++r) {
      const int32_t page = __shfl_sync(0xFFFFFFFFu, my_page, round * 2 * kScoreRows + 2 * r + half);
      if (page < 0) {  // past the stream: scored, never kept
#pragma unroll
        for (int w = 0; w < W; ++w) lo[r][w] = hi[r][w] = 0u;
        continue;
      }
      const __nv_bfloat16* b = bounds + static_cast<int64_t>(page) * 2 * D + dim0;
      load_bf16_words<L>(lo[r], b);
      load_bf16_words<L>(hi[r], b + D);
    }
    float q_pos[L], q_neg[L];
    if constexpr (kOut == BoundOutput::kGroupSum) {
      load_floats(q_pos, q_s + dim0);
      load_floats(q_neg, q_s + D + dim0);
#pragma unroll
      for (int r = 0; r < kScoreRows; ++r) {
        const float sum = half_warp_sum(bound_dot<L>(q_pos, q_neg, lo[r], hi[r]));
        write(out_row, first + 2 * r + half, sum / divisor);
      }
    } else {
      float best[kScoreRows];
      for (int g = 0; g < group; ++g) {
        load_floats(q_pos, q_s + g * 2 * D + dim0);
        load_floats(q_neg, q_s + g * 2 * D + D + dim0);
#pragma unroll
        for (int r = 0; r < kScoreRows; ++r) {
          const float bound = half_warp_sum(bound_dot<L>(q_pos, q_neg, lo[r], hi[r]));
          if constexpr (kOut == BoundOutput::kPerHead) {
            write(out_row + g, first + 2 * r + half, bound);
          } else {
            best[r] = g == 0 ? bound : fmaxf(best[r], bound);
          }
        }
      }
      if constexpr (kOut == BoundOutput::kGroupMax) {
#pragma unroll
        for (int r = 0; r < kScoreRows; ++r) write(out_row, first + 2 * r + half, best[r]);
      }
    }
  }
}

// grid (num_kv_heads, num_seqs). Of every page of the stream but the last, the (budget - 1) with the best
// group-reduced scores (scores [num_seqs][num_kv_heads][stride]) go to the list in ascending order
// (block_top_k.cuh), and the last page closes it. selected [num_seqs][num_kv_heads] lists at seq_stride /
// head_stride.
__global__ void select_top_pages_kernel(int32_t* selected, int64_t seq_stride, int head_stride,
                                        int32_t* num_selected, const float* scores, int64_t stride,
                                        const int32_t* q_indptr, const SeqKvView* seqs, int num_kv_heads,
                                        int page_size, int page_budget) {
  __shared__ BlockTopKStorage<kSelectThreads> storage;
  const int h = blockIdx.x;
  const int s = blockIdx.y;
  const int32_t num_pages = (seqs[s].num_tokens[h] + page_size - 1) / page_size;
  int32_t* out = selected + s * seq_stride + static_cast<int64_t>(h) * head_stride;
  int32_t* count = num_selected + static_cast<int64_t>(s) * num_kv_heads + h;
  if (q_indptr[s + 1] == q_indptr[s]) {  // no query row, nothing scored: an empty list
    if (threadIdx.x == 0) *count = 0;
    return;
  }
  if (num_pages <= page_budget) {
    for (int p = threadIdx.x; p < num_pages; p += kSelectThreads) out[p] = p;
    if (threadIdx.x == 0) *count = num_pages;
    return;
  }
  if (page_budget == 1) {  // the last page alone
    if (threadIdx.x == 0) {
      out[0] = num_pages - 1;
      *count = 1;
    }
    return;
  }
  const auto num_candidates =
      static_cast<int32_t>(min(static_cast<int64_t>(num_pages - 1), stride));  // (as in the scores kernel)
  if (num_candidates < page_budget - 1) {  // clamped to a stride short of the stream: no ranking to do
    for (int p = threadIdx.x; p < num_candidates; p += kSelectThreads) out[p] = p;
    if (threadIdx.x == 0) {
      out[num_candidates] = num_pages - 1;
      *count = num_candidates + 1;
    }
    return;
  }
  const float* score = scores + (static_cast<int64_t>(s) * num_kv_heads + h) * stride;
  block_top_k_ascending<kSelectThreads, kSelectBatch>(storage, out, num_candidates, page_budget - 1,
                                                      [score](int p) { return order_key(score[p]); });
  if (threadIdx.x == 0) {
    out[page_budget - 1] = num_pages - 1;
    *count = page_budget;
  }
}

// The view as the kernels read it, with result_bytes of scratch: itself when its tables are on the device, else
// a staged copy of them.
StagedView device_tables(const AttentionView& view, size_t result_bytes) {
  if (view.tables_device == Device::kCuda)
    return {view, result_bytes > 0 ? CudaContext::current().scratch(result_bytes) : nullptr};
  return stage_view_tables(view, result_bytes);
}

// Enqueues the bound scores of every sequence of `view` (tables on the device) into out [num_seqs, rows, stride]:
// per KV head reduced over its group (rows = num_kv_heads), or per query head (reduce = nullopt, rows = H).
void enqueue_bound_scores(float* out, int64_t stride, TensorView q, TensorView bounds, const AttentionView& view,
                          std::optional<GroupReduce> reduce) {
  const int group = static_cast<int>(q.shape[q.shape.rank() - 2] / view.num_kv_heads);
  const BoundOutput output = !reduce.has_value()          ? BoundOutput::kPerHead
                             : *reduce == GroupReduce::kMax ? BoundOutput::kGroupMax
                                                            : BoundOutput::kGroupSum;
  const int staged_heads = output == BoundOutput::kGroupSum ? 1 : group;
  const size_t smem = static_cast<size_t>(staged_heads) * 2 * view.head_dim * sizeof(float);
  SE_CHECK(smem <= 48 * 1024, "cuda page-bound scores: a query group of {} x {} exceeds 48 KB", group,
           view.head_dim);
  const float divisor = reduce == GroupReduce::kMean ? static_cast<float>(group) : 1.0f;
  const dim3 grid(static_cast<unsigned>(launch::ceil_div(stride, int64_t{kPagesPerBlock})),
                  static_cast<unsigned>(view.num_kv_heads), static_cast<unsigned>(view.num_seqs));
  const auto launch = [&]<int D>() {
    const auto kernel = output == BoundOutput::kPerHead    ? page_key_bound_scores_kernel<D, BoundOutput::kPerHead>
                        : output == BoundOutput::kGroupMax ? page_key_bound_scores_kernel<D, BoundOutput::kGroupMax>
                                                           : page_key_bound_scores_kernel<D, BoundOutput::kGroupSum>;
    kernel<<<grid, kScoreWarps * 32, smem, CudaContext::current().stream()>>>(
        out, stride, q.data, q.dtype, view.q_indptr, view.seqs, bounds.ptr<__nv_bfloat16>(), view.num_kv_heads,
        group, view.page_size, divisor);
  };
  switch (view.head_dim) {
    case 64:
      launch.template operator()<64>();
      break;
    case 128:
      launch.template operator()<128>();
      break;
    case 256:
      launch.template operator()<256>();
      break;
    default:
      SE_CHECK(false, "cuda page-bound scores: head_dim {} (64, 128 or 256)", view.head_dim);
  }
  SE_CUDA_CHECK_LAUNCH("page_key_bound_scores_kernel");
}
}  // namespace

void update_page_key_bounds(TensorView bounds, const AttentionView& view, int32_t max_new_tokens) {
  if (view.num_seqs == 0 || max_new_tokens <= 0) return;
  const StagedView staged = device_tables(view, 0);
  // n new tokens span at most ceil((n - 1) / page_size) + 1 pages of a stream.
  const int32_t chunks = std::min<int32_t>((max_new_tokens - 1 + view.page_size - 1) / view.page_size + 1, 1024);
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(view.num_kv_heads),
                  static_cast<unsigned>(view.num_seqs));
  const int threads = std::min(256, (view.head_dim + 31) / 32 * 32);
  update_page_key_bounds_kernel<<<grid, threads, 0, CudaContext::current().stream()>>>(
      bounds.ptr<__nv_bfloat16>(), staged.view.q_indptr, staged.view.seqs, static_cast<const char*>(view.kv_base),
      view.page_bytes, view.page_size, view.head_dim);
  SE_CUDA_CHECK_LAUNCH("update_page_key_bounds_kernel");
}

void page_key_bound_scores(TensorView out, TensorView q, TensorView bounds, const AttentionView& view, int32_t slice) {
  if (out.numel() == 0) return;
  // The one-sequence view of `slice`, its single query row being q's only row.
  const int32_t one_row[2] = {0, 1};
  AttentionView one = view;
  one.seqs = view.seqs + slice;
  one.q_indptr = one_row;
  one.num_seqs = 1;
  const int64_t stride = out.shape[1];
  const StagedView staged = stage_view_tables(one, static_cast<size_t>(out.numel()) * sizeof(float));
  auto* scores = static_cast<float*>(staged.results);
  enqueue_bound_scores(scores, stride, q, bounds, staged.view, std::nullopt);
  fetch_results(out.data, scores, static_cast<size_t>(out.numel()) * sizeof(float));
  // The kernel scores up to the sequence's longest stream; wider columns are -inf too.
  int32_t longest = 0;
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    longest = std::max(longest, (view.seqs[slice].num_tokens[h] + view.page_size - 1) / view.page_size);
  for (int64_t row = 0; row < out.shape[0]; ++row)
    std::fill(out.ptr<float>() + row * stride + std::min<int64_t>(longest, stride), out.ptr<float>() + (row + 1) * stride,
              -INFINITY);
}

void select_pages_by_key_bounds(TensorView selected, TensorView num_selected, TensorView q, TensorView bounds,
                                const AttentionView& view, int32_t page_budget, int32_t max_pages_per_stream,
                                GroupReduce reduce) {
  if (view.num_seqs == 0) return;
  const int64_t stride = std::max(max_pages_per_stream, 1);
  const size_t score_bytes = static_cast<size_t>(int64_t{view.num_seqs} * view.num_kv_heads * stride) * sizeof(float);
  const StagedView staged = device_tables(view, score_bytes);
  auto* scores = static_cast<float*>(staged.results);
  enqueue_bound_scores(scores, stride, q, bounds, staged.view, reduce);
  const dim3 grid(static_cast<unsigned>(view.num_kv_heads), static_cast<unsigned>(view.num_seqs));
  select_top_pages_kernel<<<grid, kSelectThreads, 0, CudaContext::current().stream()>>>(
      selected.ptr<int32_t>(), selected.shape[1] * selected.shape[2], static_cast<int>(selected.shape[2]),
      num_selected.ptr<int32_t>(), scores, stride, staged.view.q_indptr, staged.view.seqs, view.num_kv_heads,
      view.page_size, page_budget);
  SE_CUDA_CHECK_LAUNCH("select_top_pages_kernel");
}

}  // namespace se::cuda
