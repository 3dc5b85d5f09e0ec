// Random sampling on the device without sorting the vocabulary. The CPU reference sorts a row by logit
// (descending, the lower id first on a tie) and walks the sorted prefix; every cut it makes (top-k, top-p, the
// draw) is the first element of that order whose cumulative weight crosses a target. One block per row finds
// each such element by radix select: the logits' order-preserving 32-bit keys, 8 bits per pass from the top,
// a histogram of the weights per digit among the candidates, and the digit where the running sum crosses; after
// four passes only ties remain, which go in id order. Weights (at most 1) are fixed point, 2^63 / width to one,
// so histogram sums are exact integers in any order and cannot overflow; a draw differs from the CPU's fp64 walk only when it lands within about 1e-9
// of a boundary. A row costs about 17 passes over its logits, which stay in L2.
#include <cub/cub.cuh>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/host_tables.h"

namespace se::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kHistCopies = 8;  // warps share a histogram copy 4 at a time, to spread the shared atomics

// Ascending key <=> descending logit (-0 and +0 are one value, as the CPU compares them).
__device__ __forceinline__ uint32_t sort_key(float logit) {
  const uint32_t bits = logit == 0.0f ? 0u : __float_as_uint(logit);
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return ~ascending;
}

// The first element, in (key, id) order, of a row's candidates.
struct Cut {
  uint32_t key = 0xFFFFFFFFu;
  int32_t id = INT32_MAX;
};

__device__ __forceinline__ bool within(uint32_t key, int32_t id, Cut cut) {
  return key < cut.key || (key == cut.key && id <= cut.id);
}

struct RowContext {
  const void* x;
  DType dtype;
  int64_t offset;  // of the row
  int32_t width;
  float max_logit, inv_t, min_scaled;
  double fixed_one;  // the fixed-point weight of the top logit
  Cut limit;  // candidates: min-p survivors within the limit

  __device__ float logit(int32_t i) const { return load_as_float(x, dtype, offset + i); }
  __device__ bool candidate(float l, uint32_t key, int32_t i) const {
    return __fmul_rn(l, inv_t) >= min_scaled && within(key, i, limit);
  }
  // The CPU's exp((logit - max) / T) in fp64, in fixed point.
  __device__ uint64_t weight(float l) const {
    return __double2ull_rn(exp(static_cast<double>(__fsub_rn(l, max_logit)) * static_cast<double>(inv_t)) *
                           fixed_one);
  }
};

// Calls fn(i, logit) for each logit of the row this thread owns, with four loads in flight at a time: one block
// reads the whole row, so the passes are bound by how many loads each thread keeps waiting.
template <typename Fn>
__device__ __forceinline__ void for_each_logit(const RowContext& row, Fn&& fn) {
  constexpr int kUnroll = 4;
  int32_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < row.width; i += kUnroll * kThreads) {
    float l[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) l[u] = row.logit(i + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fn(i + u * kThreads, l[u]);
  }
  for (; i < row.width; i += kThreads) fn(i, row.logit(i));
}

struct SelectShared {
  unsigned long long hist[kHistCopies][256];
  uint32_t prefix;
  unsigned long long before;
  bool take_last;
  int32_t tie_index;
  int32_t found_id;
};

struct MaxOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};

template <typename T>
__device__ T block_sum(T v) {
  using Reduce = cub::BlockReduce<T, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ T result;
  v = Reduce(temp).Sum(v);
  if (threadIdx.x == 0) result = v;
  __syncthreads();
  const T out = result;
  __syncthreads();
  return out;
}

__device__ float block_max(float v) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float result;
  v = Reduce(temp).Reduce(v, MaxOp{});
  if (threadIdx.x == 0) result = v;
  __syncthreads();
  const float out = result;
  __syncthreads();
  return out;
}

// The first candidate, in (key, id) order, whose cumulative weight (fixed point, or 1 per candidate with
// `count`) crosses `target`: exceeds it with `strict`, reaches it otherwise. None crosses: the last candidate.
__device__ Cut select_crossing(const RowContext& row, double target, bool strict, bool count, SelectShared& s) {
  const auto crosses = [&](unsigned long long cumulative) {
    const double c = static_cast<double>(cumulative);
    return strict ? c > target : c >= target;
  };
  unsigned long long* hist = s.hist[(threadIdx.x / 32) % kHistCopies];
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.before = 0;
    s.take_last = false;
  }
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kHistCopies * 256; i += kThreads) (&s.hist[0][0])[i] = 0;
    __syncthreads();
    const uint32_t prefix = s.prefix;
    for_each_logit(row, [&](int32_t i, float l) {
      const uint32_t key = sort_key(l);
      if ((key & mask) != prefix || !row.candidate(l, key, i)) return;
      atomicAdd(&hist[(key >> shift) & 255u], count ? 1ull : static_cast<unsigned long long>(row.weight(l)));
    });
    __syncthreads();
    if (threadIdx.x < 256)
      for (int c = 1; c < kHistCopies; ++c) s.hist[0][threadIdx.x] += s.hist[c][threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1, last = -1;
      unsigned long long before = s.before;
      for (int b = 0; b < 256; ++b) {
        const unsigned long long h = s.hist[0][b];
        if (h == 0) continue;
        last = b;
        if (!s.take_last && crosses(before + h)) {
          chosen = b;
          break;
        }
        before += h;
      }
      if (chosen < 0) {  // nothing crosses (or an earlier pass took the last digit): keep the last candidate
        chosen = last;
        s.take_last = true;
      }
      s.before = s.take_last ? s.before : before;
      s.prefix = prefix | (static_cast<uint32_t>(chosen) << shift);
    }
    mask |= 0xFFu << shift;
    __syncthreads();
  }

  // Ties on the key: id order. The last one, or the first whose cumulative weight crosses.
  const uint32_t key = s.prefix;
  if (threadIdx.x == 0) s.found_id = -1;
  int32_t num_ties = 0;
  int32_t max_tie = -1;
  unsigned long long tie_weight = 0;
  for_each_logit(row, [&](int32_t i, float l) {
    if (sort_key(l) != key || !row.candidate(l, key, i)) return;
    ++num_ties;
    max_tie = max(max_tie, i);
    tie_weight += count ? 1ull : static_cast<unsigned long long>(row.weight(l));
  });
  num_ties = block_sum(num_ties);
  tie_weight = block_sum(tie_weight) / static_cast<unsigned long long>(max(num_ties, 1));  // all weigh the same
  using ReduceI = cub::BlockReduce<int32_t, kThreads>;
  __shared__ typename ReduceI::TempStorage reduce_temp;
  max_tie = ReduceI(reduce_temp).Reduce(max_tie, MaxOp{});
  if (threadIdx.x == 0) {
    int32_t j = num_ties - 1;
    if (!s.take_last) {
      unsigned long long cumulative = s.before;
      for (int32_t t = 0; t < num_ties; ++t) {
        cumulative += tie_weight;
        if (crosses(cumulative)) {
          j = t;
          break;
        }
      }
    }
    s.tie_index = j;
    if (j == num_ties - 1) s.found_id = max_tie;
  }
  __syncthreads();
  using ScanI = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename ScanI::TempStorage scan_temp;
  for (int32_t base = 0, seen = 0; s.found_id < 0 && base < row.width; base += kThreads) {
    const int32_t i = base + static_cast<int32_t>(threadIdx.x);
    int32_t is_tie = 0;
    if (i < row.width) {
      const float l = row.logit(i);
      is_tie = sort_key(l) == key && row.candidate(l, key, i) ? 1 : 0;
    }
    int32_t rank = 0, in_chunk = 0;
    ScanI(scan_temp).ExclusiveSum(is_tie, rank, in_chunk);
    if (is_tie != 0 && seen + rank == s.tie_index) s.found_id = i;
    seen += in_chunk;
    __syncthreads();
  }
  const Cut cut{key, s.found_id};
  __syncthreads();
  return cut;
}

// One block per row: the CPU reference's cuts (min-p, top-k, top-p, the draw), found by select_crossing.
__global__ void __launch_bounds__(kThreads) sample_rows_kernel(int32_t* out_ids, float* out_logprobs, const void* x,
                                                               DType dtype, const RowSampling* settings,
                                                               int32_t width, double fixed_one) {
  __shared__ SelectShared shared;
  const RowSampling s = settings[blockIdx.x];
  RowContext row{x, dtype, static_cast<int64_t>(blockIdx.x) * width, width, 0.0f, 0.0f, 0.0f, fixed_one, Cut{}};

  float max_logit = -FLT_MAX;
  for_each_logit(row, [&](int32_t, float l) { max_logit = fmaxf(max_logit, l); });
  max_logit = block_max(max_logit);
  double full = 0.0;
  for_each_logit(row, [&](int32_t, float l) { full += exp(static_cast<double>(__fsub_rn(l, max_logit))); });
  const double full_sum = block_sum(full);

  row.max_logit = max_logit;
  row.inv_t = __fdiv_rn(1.0f, s.temperature);
  // min_p * p_max <=> scaled logit >= max_scaled + log(min_p); no FMA contraction, as the host computes it.
  row.min_scaled = s.min_p > 0.0f ? __fadd_rn(__fmul_rn(max_logit, row.inv_t), logf(s.min_p)) : -INFINITY;

  if (s.top_k > 0) {
    int32_t passing = 0;
    for_each_logit(row, [&](int32_t i, float l) { passing += row.candidate(l, sort_key(l), i) ? 1 : 0; });
    if (s.top_k < block_sum(passing))
      row.limit = select_crossing(row, static_cast<double>(s.top_k), /*strict=*/false, /*count=*/true, shared);
  }
  auto kept_weight = [&] {
    unsigned long long local = 0;
    for_each_logit(row, [&](int32_t i, float l) {
      if (row.candidate(l, sort_key(l), i)) local += row.weight(l);
    });
    return static_cast<double>(block_sum(local));
  };
  if (s.top_p < 1.0f)
    row.limit = select_crossing(row, static_cast<double>(s.top_p) * kept_weight(), /*strict=*/false,
                                /*count=*/false, shared);
  const Cut chosen = select_crossing(row, s.u * kept_weight(), /*strict=*/true, /*count=*/false, shared);
  if (threadIdx.x == 0) {
    out_ids[blockIdx.x] = chosen.id;
    out_logprobs[blockIdx.x] = static_cast<float>(__fsub_rn(row.logit(chosen.id), max_logit) - log(full_sum));
  }
}

}  // namespace

void sample_rows(TensorView ids, TensorView logprobs, TensorView x, std::span<const RowSampling> rows) {
  const int64_t num_rows = ids.numel();
  if (num_rows == 0) return;
  const auto width = static_cast<int32_t>(x.shape[x.shape.rank() - 1]);
  const StagedTables staged = stage_host_tables(rows.data(), rows.size_bytes(), 0);
  const double fixed_one = std::ldexp(1.0, 63 - std::bit_width(static_cast<uint32_t>(width)));
  sample_rows_kernel<<<static_cast<unsigned>(num_rows), kThreads, 0, CudaContext::current().stream()>>>(
      ids.ptr<int32_t>(), logprobs.ptr<float>(), x.data, x.dtype, static_cast<const RowSampling*>(staged.tables),
      width, fixed_one);
  SE_CUDA_CHECK_LAUNCH("sample_rows_kernel");
}

}  // namespace se::cuda
