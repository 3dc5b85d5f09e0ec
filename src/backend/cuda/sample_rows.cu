// Random sampling on the device. Each row is sorted by logit with CUB's segmented radix sort (descending and
// stable, so equal logits keep the lower id first: the CPU's order), then one block per row walks the sorted
// prefix in fp64 as the CPU reference does. The walks need prefix sums of the kept probabilities: every thread
// owns one contiguous segment of the prefix, a block scan of the segment sums gives each segment's start, and the
// one thread whose segment holds the crossing walks it token by token. Rows are sorted in chunks so the scratch
// stays bounded at large batch x vocabulary.
#include <cub/cub.cuh>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/host_tables.h"

namespace se::cuda {

namespace {

constexpr int kThreads = 512;
// Sort buffers of one chunk of rows: keys and ids, in and out, 16 bytes per logit.
constexpr size_t kMaxSortBytes = size_t{64} << 20;

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// keys = the logits as fp32, ids = 0..width-1 per row, offsets[r] = r * width (the segments).
__global__ void load_sort_keys_kernel(float* keys, int32_t* ids, int32_t* offsets, const void* x, DType dtype,
                                      int64_t first_row, int32_t num_rows, int32_t width) {
  const int32_t row = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && row == 0)
    for (int32_t r = threadIdx.x; r <= num_rows; r += blockDim.x) offsets[r] = r * width;
  if (i >= width) return;
  const int64_t out = static_cast<int64_t>(row) * width + i;
  keys[out] = load_as_float(x, dtype, (first_row + row) * width + i);
  ids[out] = static_cast<int32_t>(i);
}

__device__ __forceinline__ double kept_prob(float logit, float max_logit, float inv_t) {
  return exp(static_cast<double>(__fsub_rn(logit, max_logit)) * static_cast<double>(inv_t));
}

// One block per row of the chunk. keys/ids: the row sorted descending.
__global__ void __launch_bounds__(kThreads) sample_sorted_rows_kernel(int32_t* out_ids, float* out_logprobs, const float* sorted_keys,
                                          const int32_t* sorted_ids, const RowSampling* settings, int32_t width) {
  using BlockReduceD = cub::BlockReduce<double, kThreads>;
  using BlockReduceI = cub::BlockReduce<int32_t, kThreads>;
  using BlockScanD = cub::BlockScan<double, kThreads>;
  __shared__ union {
    typename BlockReduceD::TempStorage reduce_d;
    typename BlockReduceI::TempStorage reduce_i;
    typename BlockScanD::TempStorage scan;
  } temp;
  __shared__ double shared_sum;
  __shared__ int32_t shared_count;
  __shared__ int32_t top_p_end;  // the first index reaching the top-p mass
  __shared__ int32_t chosen;

  const RowSampling s = settings[blockIdx.x];
  const float* keys = sorted_keys + static_cast<int64_t>(blockIdx.x) * width;
  const float max_logit = keys[0];
  const float inv_t = __fdiv_rn(1.0f, s.temperature);
  // min_p * p_max <=> scaled logit >= max_scaled + log(min_p); no FMA contraction, as the host computes it.
  const float min_scaled = s.min_p > 0.0f ? __fadd_rn(__fmul_rn(max_logit, inv_t), logf(s.min_p)) : -INFINITY;

  double full = 0.0;
  int32_t passing = 0;
  for (int32_t i = threadIdx.x; i < width; i += kThreads) {
    full += exp(static_cast<double>(__fsub_rn(keys[i], max_logit)));
    passing += __fmul_rn(keys[i], inv_t) >= min_scaled ? 1 : 0;
  }
  full = BlockReduceD(temp.reduce_d).Sum(full);
  if (threadIdx.x == 0) shared_sum = full;
  __syncthreads();
  passing = BlockReduceI(temp.reduce_i).Sum(passing);
  if (threadIdx.x == 0) shared_count = passing;
  __syncthreads();
  const double full_sum = shared_sum;
  // Sorted descending, the min-p survivors are a prefix.
  int32_t keep = shared_count;
  if (s.top_k > 0 && s.top_k < keep) keep = s.top_k;

  const int32_t seg = (keep + kThreads - 1) / kThreads;
  const int32_t seg_begin = min(keep, static_cast<int32_t>(threadIdx.x) * seg);
  const int32_t seg_end = min(keep, seg_begin + seg);
  double local = 0.0;
  for (int32_t i = seg_begin; i < seg_end; ++i) local += kept_prob(keys[i], max_logit, inv_t);
  double seg_start = 0.0;
  double total = 0.0;
  BlockScanD(temp.scan).ExclusiveSum(local, seg_start, total);
  if (threadIdx.x == 0) {
    top_p_end = keep - 1;
    chosen = INT32_MAX;
  }
  __syncthreads();

  // Top-p: the first index whose cumulative mass reaches top_p of the total.
  if (s.top_p < 1.0f) {
    const double target = static_cast<double>(s.top_p) * total;
    if (seg_begin < seg_end && seg_start < target && seg_start + local >= target) {
      double cumulative = seg_start;
      for (int32_t i = seg_begin; i < seg_end; ++i) {
        cumulative += kept_prob(keys[i], max_logit, inv_t);
        if (cumulative >= target) {
          atomicMin(&top_p_end, i);
          break;
        }
      }
    }
    __syncthreads();
    keep = top_p_end + 1;
  }

  // The kept mass: the cumulative sum at keep - 1, found by the segment that holds it.
  const int32_t last = keep - 1;
  if (seg_begin <= last && last < seg_end) {
    double cumulative = seg_start;
    for (int32_t i = seg_begin; i <= last; ++i) cumulative += kept_prob(keys[i], max_logit, inv_t);
    shared_sum = cumulative;
  }
  __syncthreads();
  const double draw = s.u * shared_sum;
  if (seg_begin < seg_end && seg_begin <= last && seg_start <= draw && seg_start + local > draw) {
    double cumulative = seg_start;
    for (int32_t i = seg_begin; i < seg_end && i <= last; ++i) {
      cumulative += kept_prob(keys[i], max_logit, inv_t);
      if (cumulative > draw) {
        atomicMin(&chosen, i);
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t pick = min(chosen, last);
    out_ids[blockIdx.x] = sorted_ids[static_cast<int64_t>(blockIdx.x) * width + pick];
    out_logprobs[blockIdx.x] = static_cast<float>(__fsub_rn(keys[pick], max_logit) - log(full_sum));
  }
}

}  // namespace

void sample_rows(TensorView ids, TensorView logprobs, TensorView x, std::span<const RowSampling> rows) {
  const int64_t num_rows = ids.numel();
  if (num_rows == 0) return;
  const auto width = static_cast<int32_t>(x.shape[x.shape.rank() - 1]);
  const auto chunk_rows = static_cast<int32_t>(
      std::clamp<int64_t>(static_cast<int64_t>(kMaxSortBytes / (size_t{16} * width)), 1, num_rows));
  const int64_t chunk_items = int64_t{chunk_rows} * width;
  cudaStream_t stream = CudaContext::current().stream();

  size_t sort_temp_bytes = 0;
  SE_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, sort_temp_bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), chunk_items, chunk_rows,
      static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr), 0, 32, stream));
  const size_t key_bytes = align16(static_cast<size_t>(chunk_items) * sizeof(float));
  const size_t offset_bytes = align16(static_cast<size_t>(chunk_rows + 1) * sizeof(int32_t));
  const StagedTables staged =
      stage_host_tables(rows.data(), rows.size_bytes(), 4 * key_bytes + offset_bytes + sort_temp_bytes);
  char* p = static_cast<char*>(staged.results);
  auto* keys_in = reinterpret_cast<float*>(p);
  auto* keys_out = reinterpret_cast<float*>(p + key_bytes);
  auto* ids_in = reinterpret_cast<int32_t*>(p + 2 * key_bytes);
  auto* ids_out = reinterpret_cast<int32_t*>(p + 3 * key_bytes);
  auto* offsets = reinterpret_cast<int32_t*>(p + 4 * key_bytes);
  void* sort_temp = p + 4 * key_bytes + offset_bytes;
  const auto* settings = static_cast<const RowSampling*>(staged.tables);

  for (int64_t first = 0; first < num_rows; first += chunk_rows) {
    const auto n = static_cast<int32_t>(std::min<int64_t>(chunk_rows, num_rows - first));
    const dim3 load_grid(static_cast<unsigned>((width + 255) / 256), static_cast<unsigned>(n));
    load_sort_keys_kernel<<<load_grid, 256, 0, stream>>>(keys_in, ids_in, offsets, x.data, x.dtype, first, n,
                                                         width);
    SE_CUDA_CHECK_LAUNCH("load_sort_keys_kernel");
    size_t temp_bytes = sort_temp_bytes;
    SE_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(sort_temp, temp_bytes, keys_in, keys_out,
                                                                     ids_in, ids_out, int64_t{n} * width, n,
                                                                     offsets, offsets + 1, 0, 32, stream));
    sample_sorted_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        ids.ptr<int32_t>() + first, logprobs.ptr<float>() + first, keys_out, ids_out, settings + first, width);
    SE_CUDA_CHECK_LAUNCH("sample_sorted_rows_kernel");
  }
}

}  // namespace se::cuda
