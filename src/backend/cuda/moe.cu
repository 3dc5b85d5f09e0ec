// The mixture-of-experts kernels (backend/moe_ops.h on CUDA): one warp per row for the router, one block for the
// grouping, a thread per (row, column) for the weighted sum, and three grouped GEMMs whose grids span every expert
// (blocks of an expert without rows return before reading its weights):
// - a decode GEMV (few rows per expert): one warp per kGemvCols output columns streams those weight rows once with
//   16-byte loads (kGemvCols loads in flight per lane) and applies them to up to kGemvRows of the expert's rows at
//   a time, so a step reads each chosen expert's weights about once, at memory speed;
// - a tensor-core GEMM (bf16 mma, fp32 accumulation) on 64 x 64 tiles for prefill-sized batches;
//   both read block-scaled FP8 expert weights as stored (one byte per weight) and apply their block scales in fp32;
// - a scalar shared-memory tiled GEMM for what the other two do not take (fp32 weights in many rows, K not a
//   multiple of the 16-byte vector).
#include <cuda_fp8.h>
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/moe.h"

namespace se::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 16;      // the scalar GEMM: a block computes a kTile x kTile tile of one expert's rows
constexpr int kGemvWarps = 8;  // the decode GEMV: warps per block,
constexpr int kGemvCols = 4;   // output columns per warp,
constexpr int kGemvRows = 4;   // and rows a pass over those columns' weights applies them to
// The decode GEMV serves batches up to this many rows (an expert then has at most as many).
constexpr int64_t kGemvMaxRows = 64;
constexpr int kMmaTile = 64;      // the tensor-core GEMM: a block computes a 64 x 64 tile of one expert's rows,
constexpr int kMmaK = 32;         // stepping K by 32 through shared memory,
constexpr int kMmaPad = 8;        // rows padded by 16 bytes against bank conflicts
constexpr int kMmaThreads = 128;  // four warps, each a 32 x 32 quarter of the tile
// group_by_expert keeps a count per expert in shared memory (the default 48 KiB of it).
constexpr int64_t kMaxExperts = 48 * 1024 / sizeof(int32_t) - 1;

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// One warp per row: the softmax over the experts with warp reductions, then k picks, each a warp-wide argmax over
// the experts ordered after the previous pick (descending probability, ties to the lower index), as the CPU
// reference's partial sort orders them.
__global__ void route_kernel(int32_t* experts, float* weights, const float* logits, int64_t t, int num_experts, int k,
                             bool normalize) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kThreads / 32) + threadIdx.x / 32;
  if (row >= t) return;
  const int lane = threadIdx.x % 32;
  const float* logit = logits + row * num_experts;
  float max_logit = -INFINITY;
  for (int e = lane; e < num_experts; e += 32) max_logit = fmaxf(max_logit, logit[e]);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffffu, max_logit, offset));
  float sum = 0.0f;
  for (int e = lane; e < num_experts; e += 32) sum += expf(logit[e] - max_logit);
  sum = warp_sum(sum);
  int prev = -1;
  float prev_p = 0.0f, chosen = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_p = -1.0f;
    for (int e = lane; e < num_experts; e += 32) {  // ascending e: a tie keeps the lower index
      const float p = expf(logit[e] - max_logit) / sum;
      const bool after_prev = prev < 0 || p < prev_p || (p == prev_p && e > prev);
      if (after_prev && p > best_p) {
        best = e;
        best_p = p;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other_p = __shfl_xor_sync(0xffffffffu, best_p, offset);
      const int other = __shfl_xor_sync(0xffffffffu, best, offset);
      if (other_p > best_p || (other_p == best_p && other >= 0 && (best < 0 || other < best))) {
        best = other;
        best_p = other_p;
      }
    }
    if (lane == 0) {
      experts[row * k + j] = best;
      weights[row * k + j] = best_p;
    }
    chosen += best_p;
    prev = best;
    prev_p = best_p;
  }
  if (normalize && lane == 0)
    for (int j = 0; j < k; ++j) weights[row * k + j] /= chosen;
}

// One block: thread e counts expert e's pairs, thread 0 turns the counts into offsets, then thread e places its
// pairs in pair order. Every thread scans all pairs, which keeps the order deterministic without a sort.
__global__ void group_kernel(int32_t* offsets, int32_t* rows, int32_t* slots, const int32_t* experts, int64_t pairs,
                             int k, int num_experts) {
  extern __shared__ int32_t next[];  // [num_experts]
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int32_t n = 0;
    for (int64_t j = 0; j < pairs; ++j) n += experts[j] == e;
    next[e] = n;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t offset = 0;
    for (int e = 0; e < num_experts; ++e) {
      const int32_t n = next[e];
      offsets[e] = next[e] = offset;
      offset += n;
    }
    offsets[num_experts] = offset;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    int32_t at = next[e];
    for (int64_t j = 0; j < pairs; ++j) {
      if (experts[j] != e) continue;
      rows[at] = static_cast<int32_t>(j / k);
      slots[j] = at;
      ++at;
    }
  }
}

// Block (x, y, e): output columns [x * kTile, +kTile) of expert e's grouped rows [y * kTile, +kTile). fp32
// accumulation over K in kTile steps through shared memory.
__global__ void grouped_linear_kernel(void* out, DType out_dtype, const void* x, const void* w, DType dtype,
                                      const int32_t* offsets, int64_t n, int64_t k) {
  const int64_t e = blockIdx.z;
  const int64_t first = offsets[e], count = offsets[e + 1] - first;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  if (row0 >= count) return;  // the whole block: no weights of an expert without rows here are read
  const int tx = threadIdx.x, ty = threadIdx.y;
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  const int64_t x_row = first + row0 + ty;  // the grouped row whose elements this thread loads and computes
  const int64_t w_row = col0 + ty;          // the weight row (output column) whose elements it loads
  const int64_t w_base = e * n * k;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    const int64_t kk = k0 + tx;
    xs[ty][tx] = row0 + ty < count && kk < k ? load_as_float(x, dtype, x_row * k + kk) : 0.0f;
    ws[ty][tx] = w_row < n && kk < k ? load_as_float(w, dtype, w_base + w_row * k + kk) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) acc += xs[ty][i] * ws[tx][i];
    __syncthreads();
  }
  if (row0 + ty < count && col0 + tx < n) store_from_float(out, out_dtype, x_row * n + col0 + tx, acc);
}

// N consecutive elements of `p` (16-byte aligned) as floats: bf16 and f32 in 16-byte loads, FP8 e4m3 codes 16 at
// a time.
template <int N>
__device__ __forceinline__ void load_vector(float (&v)[N], const __nv_bfloat16* p) {
#pragma unroll
  for (int q = 0; q < N / 8; ++q) {
    const uint4 bits = reinterpret_cast<const uint4*>(p)[q];
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&bits);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      v[8 * q + 2 * i] = f.x;
      v[8 * q + 2 * i + 1] = f.y;
    }
  }
}
template <int N>
__device__ __forceinline__ void load_vector(float (&v)[N], const float* p) {
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 f = reinterpret_cast<const float4*>(p)[q];
    v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
  }
}
template <int N>
__device__ __forceinline__ void load_vector(float (&v)[N], const uint8_t* p) {
  static_assert(N == 16, "FP8 codes load 16 at a time");
  const uint4 bits = *reinterpret_cast<const uint4*>(p);
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&bits);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3)));
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// Where a grouped GEMM finds the block scales of FP8 expert weights (moe_ops.h); scale null for other weights.
struct WeightScales {
  const float* scale = nullptr;
  int64_t rows = 0, cols = 0;              // scales per expert: [rows, cols]
  int64_t block_rows = 1, block_cols = 1;  // weight elements per scale

  // The scales of output column `col` of expert e, one per block of block_cols along K.
  __device__ const float* column(int64_t e, int64_t col) const { return scale + (e * rows + col / block_rows) * cols; }
};

// Block (x, e): warp w computes output columns [c0, c0 + kGemvCols), c0 = (x * kGemvWarps + w) * kGemvCols, of
// every grouped row of expert e, kGemvRows rows per pass over those columns' weights (the batch has at most
// kGemvMaxRows rows; an expert's repeated passes read its weights from L2). Each lane takes V consecutive elements
// of K at a time (one 16-byte load of weights per column), k a multiple of V, x and w 16-byte aligned. FP8 weights:
// a lane's V elements lie in one scale block along K and a warp's columns in one along N (block sizes multiples of
// 32), so each partial dot product takes one scale.
template <typename W, typename X, int V>
__global__ void grouped_gemv_kernel(void* out, DType out_dtype, const X* x, const W* w, WeightScales scales,
                                    const int32_t* offsets, int64_t n, int64_t k) {
  const int64_t e = blockIdx.y;
  const int64_t first = offsets[e], count = offsets[e + 1] - first;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32) * kGemvCols;
  if (count == 0 || col0 >= n) return;
  const int lane = threadIdx.x % 32;
  const int cols = static_cast<int>(min(static_cast<int64_t>(kGemvCols), n - col0));
  const W* w_rows = w + (e * n + col0) * k;
  const float* warp_scales = scales.scale != nullptr ? scales.column(e, col0) : nullptr;
  for (int64_t r0 = 0; r0 < count; r0 += kGemvRows) {
    const int64_t rows = min(static_cast<int64_t>(kGemvRows), count - r0);
    const X* x_rows = x + (first + r0) * k;
    float acc[kGemvRows][kGemvCols] = {};
    for (int64_t kk = lane * V; kk < k; kk += 32 * V) {
      float wv[kGemvCols][V];
#pragma unroll
      for (int c = 0; c < kGemvCols; ++c) {
        if (c < cols) {
          load_vector(wv[c], w_rows + c * k + kk);
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) wv[c][i] = 0.0f;
        }
      }
      const float scale = warp_scales != nullptr ? warp_scales[kk / scales.block_cols] : 1.0f;
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r) {
        if (r >= rows) break;
        float xv[V];
        load_vector(xv, x_rows + r * k + kk);
#pragma unroll
        for (int c = 0; c < kGemvCols; ++c) {
          float dot = 0.0f;
#pragma unroll
          for (int i = 0; i < V; ++i) dot += wv[c][i] * xv[i];
          acc[r][c] += scale * dot;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kGemvRows; ++r) {
      if (r >= rows) break;
#pragma unroll
      for (int c = 0; c < kGemvCols; ++c) {
        const float sum = warp_sum(acc[r][c]);
        if (lane == 0 && c < cols) store_from_float(out, out_dtype, (first + r0 + r) * n + col0 + c, sum);
      }
    }
  }
}

// Row r of the tensor-core GEMM's weight tile, K elements [kk, kk + 8 * vectors) from `src`, as bf16 in `dst`:
// bf16 weights copied, FP8 codes decoded (e4m3 values are exact in bf16; their scales apply after the MMA).
__device__ __forceinline__ void stage_weights(__nv_bfloat16* dst, const __nv_bfloat16* src) {
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
}
__device__ __forceinline__ void stage_weights(__nv_bfloat16* dst, const uint8_t* src) {
  float v[16];
  load_vector(v, src);
  __nv_bfloat162 pairs[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) pairs[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  reinterpret_cast<uint4*>(dst)[0] = reinterpret_cast<const uint4*>(pairs)[0];
  reinterpret_cast<uint4*>(dst)[1] = reinterpret_cast<const uint4*>(pairs)[1];
}

// Block (x, y, e): output columns [x * 64, +64) of expert e's grouped rows [y * 64, +64) on the tensor cores (bf16
// operands, fp32 accumulation), K in steps of kMmaK through shared memory. k is a multiple of the weights' 16-byte
// vector, x and w 16-byte aligned; rows past the expert's count, columns past n and K past k load as zeros. FP8
// weights: a warp's 32 columns and a K step lie in one scale block (block sizes multiples of 32), so each step's
// product is scaled once per warp before it joins the accumulator.
template <typename W>
__global__ void __launch_bounds__(kMmaThreads)
    grouped_mma_kernel(void* out, DType out_dtype, const __nv_bfloat16* x, const W* w, WeightScales scales,
                       const int32_t* offsets, int64_t n, int64_t k) {
  namespace wmma = nvcuda::wmma;
  constexpr bool kFp8 = std::is_same_v<W, uint8_t>;
  constexpr int kWeightVector = 16 / sizeof(W);  // weight elements per 16-byte load
  const int64_t e = blockIdx.z;
  const int64_t first = offsets[e], count = offsets[e + 1] - first;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kMmaTile, col0 = static_cast<int64_t>(blockIdx.x) * kMmaTile;
  if (row0 >= count) return;
  constexpr int kLd = kMmaK + kMmaPad;
  constexpr int kOutLd = kMmaTile + 4;
  __shared__ __align__(32) union {
    struct {
      __nv_bfloat16 x[kMmaTile][kLd];
      __nv_bfloat16 w[kMmaTile][kLd];
    } in;
    float out[kMmaTile][kOutLd];
  } tile;
  const int warp = threadIdx.x / 32, warp_row = warp / 2 * 32, warp_col = warp % 2 * 32;
  const float* warp_scales = nullptr;
  if constexpr (kFp8) warp_scales = scales.column(e, min(col0 + warp_col, n - 1));
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2], step[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  constexpr int kXVectors = kMmaK / 8, kWVectors = kMmaK / kWeightVector;
  for (int64_t k0 = 0; k0 < k; k0 += kMmaK) {
    for (int v = threadIdx.x; v < kMmaTile * kXVectors; v += kMmaThreads) {
      const int r = v / kXVectors, kk = v % kXVectors * 8;
      const bool in_k = k0 + kk < k;
      *reinterpret_cast<uint4*>(&tile.in.x[r][kk]) =
          in_k && row0 + r < count ? *reinterpret_cast<const uint4*>(x + (first + row0 + r) * k + k0 + kk)
                                   : uint4{0, 0, 0, 0};
    }
    for (int v = threadIdx.x; v < kMmaTile * kWVectors; v += kMmaThreads) {
      const int r = v / kWVectors, kk = v % kWVectors * kWeightVector;
      __nv_bfloat16* dst = &tile.in.w[r][kk];
      if (k0 + kk < k && col0 + r < n) {
        stage_weights(dst, w + (e * n + col0 + r) * k + k0 + kk);
      } else {
        for (int i = 0; i < kWeightVector; i += 8) reinterpret_cast<uint4*>(dst + i)[0] = uint4{0, 0, 0, 0};
      }
    }
    __syncthreads();
    auto& sum = kFp8 ? step : acc;  // FP8: this step's product alone, scaled below
    if constexpr (kFp8) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(step[i][j], 0.0f);
    }
#pragma unroll
    for (int kk = 0; kk < kMmaK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &tile.in.x[warp_row + i * 16][kk], kLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &tile.in.w[warp_col + j * 16][kk], kLd);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(sum[i][j], a[i], b[j], sum[i][j]);
    }
    if constexpr (kFp8) {
      const float scale = warp_scales[k0 / scales.block_cols];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int t = 0; t < acc[i][j].num_elements; ++t) acc[i][j].x[t] += scale * step[i][j].x[t];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&tile.out[warp_row + i * 16][warp_col + j * 16], acc[i][j], kOutLd, wmma::mem_row_major);
  __syncthreads();
  for (int v = threadIdx.x; v < kMmaTile * kMmaTile; v += kMmaThreads) {
    const int r = v / kMmaTile, c = v % kMmaTile;
    if (row0 + r < count && col0 + c < n)
      store_from_float(out, out_dtype, (first + row0 + r) * n + col0 + c, tile.out[r][c]);
  }
}

// Block (r, y): h[r, d] += sum_j weights[r, j] * y[slots[r * k + j], d], j in order, for d in the block's kThreads
// columns.
__global__ void combine_kernel(float* h, const float* y, const float* weights, const int32_t* slots, int64_t hidden,
                               int k) {
  const int64_t r = blockIdx.x, d = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (d >= hidden) return;
  float v = h[r * hidden + d];
  for (int j = 0; j < k; ++j) v += weights[r * k + j] * y[static_cast<int64_t>(slots[r * k + j]) * hidden + d];
  h[r * hidden + d] = v;
}

}  // namespace

void route_experts(TensorView experts, TensorView weights, TensorView logits, bool normalize) {
  const int64_t t = logits.shape[0];
  route_kernel<<<blocks_for(t, kThreads / 32), kThreads, 0, CudaContext::current().stream()>>>(
      experts.ptr<int32_t>(), weights.ptr<float>(), logits.ptr<float>(), t, static_cast<int>(logits.shape[1]),
      static_cast<int>(experts.shape[1]), normalize);
  SE_CUDA_CHECK_LAUNCH("route_kernel");
}

void group_by_expert(TensorView offsets, TensorView rows, TensorView slots, TensorView experts) {
  const int64_t num_experts = offsets.numel() - 1;
  SE_CHECK(num_experts <= kMaxExperts, "group_by_expert: {} experts; the CUDA kernel takes up to {}", num_experts,
           kMaxExperts);
  const int threads = static_cast<int>(std::min<int64_t>(num_experts, 1024));
  group_kernel<<<1, threads, static_cast<size_t>(num_experts) * sizeof(int32_t), CudaContext::current().stream()>>>(
      offsets.ptr<int32_t>(), rows.ptr<int32_t>(), slots.ptr<int32_t>(), experts.ptr<int32_t>(), experts.numel(),
      static_cast<int>(experts.shape[1]), static_cast<int>(num_experts));
  SE_CUDA_CHECK_LAUNCH("group_kernel");
}

void grouped_linear(TensorView out, TensorView x, TensorView w, TensorView offsets, int64_t max_rows,
                    TensorView w_scale) {
  const int64_t num_experts = w.shape[0], n = w.shape[1], k = w.shape[2];
  if (max_rows == 0 || num_experts == 0) return;
  const cudaStream_t stream = CudaContext::current().stream();
  const bool fp8 = w.dtype == DType::kU8;
  WeightScales scales;
  if (fp8) {
    scales = {w_scale.ptr<float>(), w_scale.shape[1], w_scale.shape[2], n / w_scale.shape[1], k / w_scale.shape[2]};
  }
  const int64_t weight_vector = 16 / static_cast<int64_t>(dtype_size(w.dtype));
  const bool aligned = (reinterpret_cast<uintptr_t>(x.data) | reinterpret_cast<uintptr_t>(w.data)) % 16 == 0;
  const bool vectorized = aligned && k % weight_vector == 0;
  SE_CHECK(vectorized || !fp8, "grouped_linear: FP8 weights need 16-byte aligned operands");  // K: moe_ops.cpp
  const int32_t* offs = offsets.ptr<int32_t>();
  if (vectorized && max_rows <= kGemvMaxRows) {
    const dim3 grid(blocks_for(n, kGemvWarps * kGemvCols), static_cast<unsigned>(num_experts));
    constexpr int kThreadsPerBlock = kGemvWarps * 32;
    if (fp8) {
      grouped_gemv_kernel<uint8_t, __nv_bfloat16, 16><<<grid, kThreadsPerBlock, 0, stream>>>(
          out.data, out.dtype, x.ptr<__nv_bfloat16>(), w.ptr<uint8_t>(), scales, offs, n, k);
    } else if (x.dtype == DType::kBF16) {
      grouped_gemv_kernel<__nv_bfloat16, __nv_bfloat16, 8><<<grid, kThreadsPerBlock, 0, stream>>>(
          out.data, out.dtype, x.ptr<__nv_bfloat16>(), w.ptr<__nv_bfloat16>(), scales, offs, n, k);
    } else {
      grouped_gemv_kernel<float, float, 4><<<grid, kThreadsPerBlock, 0, stream>>>(out.data, out.dtype, x.ptr<float>(),
                                                                                  w.ptr<float>(), scales, offs, n, k);
    }
    SE_CUDA_CHECK_LAUNCH("grouped_gemv_kernel");
    return;
  }
  if (vectorized && x.dtype == DType::kBF16) {
    const dim3 grid(blocks_for(n, kMmaTile), blocks_for(max_rows, kMmaTile), static_cast<unsigned>(num_experts));
    if (fp8) {
      grouped_mma_kernel<<<grid, kMmaThreads, 0, stream>>>(out.data, out.dtype, x.ptr<__nv_bfloat16>(),
                                                           w.ptr<uint8_t>(), scales, offs, n, k);
    } else {
      grouped_mma_kernel<<<grid, kMmaThreads, 0, stream>>>(out.data, out.dtype, x.ptr<__nv_bfloat16>(),
                                                           w.ptr<__nv_bfloat16>(), scales, offs, n, k);
    }
    SE_CUDA_CHECK_LAUNCH("grouped_mma_kernel");
    return;
  }
  const dim3 grid(blocks_for(n, kTile), blocks_for(max_rows, kTile), static_cast<unsigned>(num_experts));
  grouped_linear_kernel<<<grid, dim3(kTile, kTile), 0, stream>>>(out.data, out.dtype, x.data, w.data, x.dtype, offs, n,
                                                                 k);
  SE_CUDA_CHECK_LAUNCH("grouped_linear_kernel");
}

void moe_combine(TensorView h, TensorView y, TensorView weights, TensorView slots) {
  const dim3 grid(static_cast<unsigned>(h.shape[0]), blocks_for(h.shape[1], kThreads));
  combine_kernel<<<grid, kThreads, 0, CudaContext::current().stream()>>>(
      h.ptr<float>(), y.ptr<float>(), weights.ptr<float>(), slots.ptr<int32_t>(), h.shape[1],
      static_cast<int>(weights.shape[1]));
  SE_CUDA_CHECK_LAUNCH("combine_kernel");
}

}  // namespace se::cuda
