// CUDA twins of the decode-time compression scores (the CPU references are backend/cpu/decode_window_scores.cpp).
// Every score is a reduction over a matrix of dot products (query-key logits, or key-key cosine similarities), so
// each op first writes that matrix with one tiled f32 kernel (row_dots_kernel: a batched product A B^T over
// head_dim, f32 fused multiply-adds) and then reduces it with row and column kernels that accumulate in double, as
// the CPU does. Only the dot products round differently from the CPU's double ones (about 1e-7 relative), which
// moves a ranking only at near-ties. Scratch from CudaContext::scratch (one call per op, since the next call may
// move it); out, queries and keys on the device.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"

namespace se::cuda {

namespace {

constexpr int kThreads = 256;

// row_dots_kernel's tiling: a block computes a kTile x kTile block of the product, each of its 256 threads an 8 x 8
// of it (rows ty + 16 i, columns tx + 16 j, so the shared-memory reads of a warp never conflict), over head_dim in
// steps of kStep.
constexpr int kTile = 128;
constexpr int kStep = 8;
constexpr int kPerThread = kTile / 16;

// out[batch][row][col] = scale * sum_d A(batch, row)[d] * B(batch, col)[d], d < k. Row `row` of A starts at
// a + batch * a_batch + (row / a_group) * a_outer + (row % a_group) * a_inner: with a_group > 1 a row is one query
// head of a GQA group at one window position. Row `col` of B starts at b + batch * b_batch + col * b_row.
struct RowDots {
  const float* a;
  const float* b;
  float* out;
  int rows, cols, k;
  int64_t a_batch, a_outer, a_inner;
  int a_group;
  int64_t b_batch, b_row;
  float scale;
};

__global__ void __launch_bounds__(kThreads) row_dots_kernel(const RowDots p) {
  __shared__ float a_tile[kStep][kTile];
  __shared__ float b_tile[kStep][kTile];
  const int batch = blockIdx.z, row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  // Each thread stages 4 consecutive d of one row of each tile per step.
  const int load_row = threadIdx.x / 2, load_d = (threadIdx.x % 2) * 4;
  const float* a_row = nullptr;
  if (row0 + load_row < p.rows) {
    const int r = row0 + load_row;
    a_row = p.a + batch * p.a_batch + static_cast<int64_t>(r / p.a_group) * p.a_outer +
            static_cast<int64_t>(r % p.a_group) * p.a_inner;
  }
  const float* b_row =
      col0 + load_row < p.cols ? p.b + batch * p.b_batch + static_cast<int64_t>(col0 + load_row) * p.b_row : nullptr;
  float acc[kPerThread][kPerThread] = {};
  for (int d0 = 0; d0 < p.k; d0 += kStep) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int d = d0 + load_d + i;
      a_tile[load_d + i][load_row] = a_row != nullptr && d < p.k ? a_row[d] : 0.0f;
      b_tile[load_d + i][load_row] = b_row != nullptr && d < p.k ? b_row[d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kStep; ++s) {
      float a_reg[kPerThread], b_reg[kPerThread];
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        a_reg[i] = a_tile[s][ty + 16 * i];
        b_reg[i] = b_tile[s][tx + 16 * i];
      }
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kPerThread; ++j) acc[i][j] = fmaf(a_reg[i], b_reg[j], acc[i][j]);
    }
    __syncthreads();
  }
  float* out = p.out + static_cast<int64_t>(batch) * p.rows * p.cols;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int r = row0 + ty + 16 * i;
    if (r >= p.rows) continue;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int c = col0 + tx + 16 * j;
      if (c < p.cols) out[static_cast<int64_t>(r) * p.cols + c] = acc[i][j] * p.scale;
    }
  }
}

void launch_row_dots(const RowDots& p, int num_batches) {
  const dim3 grid(static_cast<unsigned>(launch::ceil_div(p.cols, kTile)),
                  static_cast<unsigned>(launch::ceil_div(p.rows, kTile)), static_cast<unsigned>(num_batches));
  row_dots_kernel<<<grid, kThreads, 0, CudaContext::current().stream()>>>(p);
  SE_CUDA_CHECK_LAUNCH("row_dots_kernel");
}

// The warp's max (kMax) or sum of v; every lane gets it.
template <bool kMax>
__device__ double warp_reduce(double v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const double other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmax(v, other) : v + other;
  }
  return v;
}

// A window's logits [num_kv_heads][rows * pool][n] (row_dots' output), read as softmax rows: softmax row p of KV head
// h is the elementwise max of its `pool` consecutive logit rows (a GQA group's query heads at one window position
// when the group's logits are max-pooled before the softmax; pool 1 keeps every query head its own row).
struct SoftmaxRows {
  const float* logits;
  int num_rows;  // softmax rows per KV head
  int pool;
  int n;

  __device__ double logit(int h, int p, int j) const {
    const float* row = logits + (static_cast<int64_t>(h) * num_rows + p) * pool * n + j;
    float best = row[0];
    for (int g = 1; g < pool; ++g) best = fmaxf(best, row[static_cast<int64_t>(g) * n]);
    return best;
  }
};

// One warp per softmax row (h, p): its max and sum of exp(logit - max), at stats[2 * (h * num_rows + p)].
__global__ void __launch_bounds__(kThreads) softmax_stats_kernel(double* stats, const SoftmaxRows s, int num_kv_heads) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(num_kv_heads) * s.num_rows) return;
  const int h = static_cast<int>(row / s.num_rows), p = static_cast<int>(row % s.num_rows);
  double top = -INFINITY;
  for (int j = lane; j < s.n; j += 32) top = fmax(top, s.logit(h, p, j));
  top = warp_reduce<true>(top);
  double sum = 0;
  for (int j = lane; j < s.n; j += 32) sum += exp(s.logit(h, p, j) - top);
  sum = warp_reduce<false>(sum);
  if (lane == 0) {
    stats[2 * row] = top;
    stats[2 * row + 1] = sum;
  }
}

// The column reductions (a mean over softmax rows of each key's probability, a mean over similarity rows) sum one
// term per (row, column) in double. Block (column tile, h, part) sums the rows [part * rows_per_part, +rows_per_part)
// of 32 columns: lane l of every warp takes column tile * 32 + l, the warps split the rows, and shared memory joins
// them into parts[part][h][j]. Splitting the rows over parts keeps every SM busy where a few heads' column tiles
// alone would not (a 512-key window over 8 KV heads is 128 tiles); finish_columns_kernel then adds the parts in order,
// so the sums do not depend on scheduling.
template <typename Term>
__global__ void __launch_bounds__(kThreads)
    column_parts_kernel(double* parts, const Term term, int num_rows, int rows_per_part, int n, int num_kv_heads) {
  __shared__ double warp_sums[kThreads / 32][32];
  const int h = blockIdx.y, part = blockIdx.z, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int j = blockIdx.x * 32 + lane;
  const int end = min(num_rows, (part + 1) * rows_per_part);
  double acc = 0;
  if (j < n)
    for (int i = part * rows_per_part + warp; i < end; i += kThreads / 32) acc += term(h, i, j);
  warp_sums[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || j >= n) return;
  for (int w = 1; w < kThreads / 32; ++w) acc += warp_sums[w][lane];
  parts[(static_cast<int64_t>(part) * num_kv_heads + h) * n + j] = acc;
}

// out[c] = (the sum over parts of parts[part][c]) / divisor, c < cells.
template <typename T>
__global__ void finish_columns_kernel(T* out, const double* parts, int num_parts, int64_t cells, double divisor) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cells) return;
  double sum = 0;
  for (int part = 0; part < num_parts; ++part) sum += parts[part * cells + c];
  out[c] = static_cast<T>(sum / divisor);
}

// How many parts reduce_columns splits num_rows rows into: about four blocks per SM, each part at least 64 rows (8
// per warp).
int column_parts(int num_rows, int n, int num_kv_heads) {
  const int64_t blocks = launch::ceil_div(n, 32) * num_kv_heads;
  const int64_t target = int64_t{4} * CudaContext::current().props().multiProcessorCount;
  return static_cast<int>(std::clamp<int64_t>(launch::ceil_div(target, blocks), 1, launch::ceil_div(num_rows, 64)));
}
// out[h][j] = (the sum over rows i < num_rows of term(h, i, j)) / divisor, for j < n. `parts`: room for
// column_parts(num_rows, n, num_kv_heads) x num_kv_heads x n doubles.
template <typename T, typename Term>
void reduce_columns(T* out, double* parts, const Term& term, int num_rows, int n, int num_kv_heads, double divisor) {
  const int num_parts = column_parts(num_rows, n, num_kv_heads);
  const auto rows_per_part = static_cast<int>(launch::ceil_div(num_rows, num_parts));
  const cudaStream_t stream = CudaContext::current().stream();
  column_parts_kernel<<<dim3(launch::grid_for(n, 32), static_cast<unsigned>(num_kv_heads),
                             static_cast<unsigned>(num_parts)),
                        kThreads, 0, stream>>>(parts, term, num_rows, rows_per_part, n, num_kv_heads);
  SE_CUDA_CHECK_LAUNCH("column_parts_kernel");
  const int64_t cells = int64_t{num_kv_heads} * n;
  finish_columns_kernel<<<launch::grid_for(cells, kThreads), kThreads, 0, stream>>>(out, parts, num_parts, cells,
                                                                                    divisor);
  SE_CUDA_CHECK_LAUNCH("finish_columns_kernel");
}

// A softmax row's probability of key j: the term of a window's mean probabilities.
struct Probability {
  SoftmaxRows s;
  const double* stats;  // [num_kv_heads][num_rows][2]: each softmax row's max and sum
  __device__ double operator()(int h, int p, int j) const {
    const double* row_stats = stats + 2 * (static_cast<int64_t>(h) * s.num_rows + p);
    return exp(s.logit(h, p, j) - row_stats[0]) / row_stats[1];
  }
};

// group_max: a softmax row per (window row, KV head) over its group's max-pooled logits; else one per (window row,
// query head).
void window_scores(TensorView out, TensorView queries, TensorView keys, bool group_max) {
  const int rows = static_cast<int>(queries.shape[0]), num_heads = static_cast<int>(queries.shape[1]);
  const int n = static_cast<int>(keys.shape[0]), num_kv_heads = static_cast<int>(keys.shape[1]),
            head_dim = static_cast<int>(keys.shape[2]);
  const int group = num_heads / num_kv_heads;
  const SoftmaxRows unscored{nullptr, group_max ? rows : rows * group, group_max ? group : 1, n};
  // Scratch: softmax stats [num_kv_heads][num_rows][2] f64, the column parts f64, then the logits
  // [num_kv_heads][rows * group][n] f32.
  const size_t stats_bytes = sizeof(double) * 2 * static_cast<size_t>(num_kv_heads) * unscored.num_rows;
  const size_t parts_bytes =
      sizeof(double) * static_cast<size_t>(column_parts(unscored.num_rows, n, num_kv_heads)) * num_kv_heads * n;
  const size_t logits_bytes = sizeof(float) * static_cast<size_t>(num_kv_heads) * rows * group * n;
  char* scratch = static_cast<char*>(CudaContext::current().scratch(stats_bytes + parts_bytes + logits_bytes));
  auto* stats = reinterpret_cast<double*>(scratch);
  auto* parts = reinterpret_cast<double*>(scratch + stats_bytes);
  auto* logits = reinterpret_cast<float*>(scratch + stats_bytes + parts_bytes);
  // Batch h, row r * group + g: query head h * group + g at window row r against KV head h's keys.
  const int64_t d = head_dim;
  launch_row_dots(
      RowDots{queries.ptr<float>(), keys.ptr<float>(), logits, rows * group, n, head_dim, group * d, num_heads * d, d,
              group, d, num_kv_heads * d, static_cast<float>(1.0 / sqrt(static_cast<double>(head_dim)))},
      num_kv_heads);
  SoftmaxRows s = unscored;
  s.logits = logits;
  CudaContext& context = CudaContext::current();
  const int64_t lanes = int64_t{num_kv_heads} * s.num_rows * 32;
  softmax_stats_kernel<<<launch::grid_for(lanes, kThreads), kThreads, 0, context.stream()>>>(stats, s, num_kv_heads);
  SE_CUDA_CHECK_LAUNCH("softmax_stats_kernel");
  reduce_columns(out.ptr<float>(), parts, Probability{s, stats}, s.num_rows, n, num_kv_heads, s.num_rows);
}

// Block (t, h): unit[h][t] = k / (|k| + 1e-8), rounded to f32 as the CPU's.
__global__ void __launch_bounds__(kThreads)
    unit_keys_kernel(float* unit, const float* keys, int num_tokens, int num_kv_heads, int head_dim) {
  const int t = blockIdx.x, h = blockIdx.y;
  const float* k = keys + (static_cast<int64_t>(t) * num_kv_heads + h) * head_dim;
  // The CPU sums the squares in order; one thread does the same here.
  __shared__ double norm;
  if (threadIdx.x == 0) {
    double sum = 0;
    for (int c = 0; c < head_dim; ++c) sum += static_cast<double>(k[c]) * k[c];
    norm = sqrt(sum) + 1e-8;
  }
  __syncthreads();
  float* u = unit + (static_cast<int64_t>(h) * num_tokens + t) * head_dim;
  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) u[c] = static_cast<float>(k[c] / norm);
}

// One warp per row (h, i) of the similarities [num_kv_heads][T][T]: newest[h][i] = the largest j != i with
// S[i, j] > threshold, or 0.
__global__ void __launch_bounds__(kThreads) newest_duplicate_kernel(int32_t* newest, const float* similarity,
                                                                    int num_tokens, int num_kv_heads, float threshold) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<int64_t>(num_kv_heads) * num_tokens) return;
  const int i = static_cast<int>(row % num_tokens);
  const float* s = similarity + row * num_tokens;
  double found = -1;
  for (int j = lane; j < num_tokens; j += 32)
    if (j != i && s[j] > threshold) found = j;
  found = warp_reduce<true>(found);
  if (lane == 0) newest[row] = found < 0 ? 0 : static_cast<int32_t>(found);
}

// A similarity row's entry at column j, without the diagonal and the row's newest near-duplicate: the term of
// key_redundancy's column means.
struct Similarity {
  const float* similarity;  // [num_kv_heads][T][T]
  const int32_t* newest;    // [num_kv_heads][T]
  int num_tokens;
  __device__ double operator()(int h, int i, int j) const {
    const int64_t row = static_cast<int64_t>(h) * num_tokens + i;
    return i == j || newest[row] == j ? 0.0 : similarity[row * num_tokens + j];
  }
};

// Block h: out[h] = softmax of column_mean[h].
__global__ void __launch_bounds__(kThreads) softmax_rows_kernel(float* out, const double* column_mean, int num_tokens) {
  __shared__ double shared[kThreads / 32];
  const auto block_reduce = [&](double v, bool is_max) {
    v = is_max ? warp_reduce<true>(v) : warp_reduce<false>(v);
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    double all = shared[0];
    for (int w = 1; w < kThreads / 32; ++w) all = is_max ? fmax(all, shared[w]) : all + shared[w];
    __syncthreads();
    return all;
  };
  const double* row = column_mean + static_cast<int64_t>(blockIdx.x) * num_tokens;
  double top = -INFINITY;
  for (int j = threadIdx.x; j < num_tokens; j += kThreads) top = fmax(top, row[j]);
  top = block_reduce(top, true);
  double sum = 0;
  for (int j = threadIdx.x; j < num_tokens; j += kThreads) sum += exp(row[j] - top);
  sum = block_reduce(sum, false);
  for (int j = threadIdx.x; j < num_tokens; j += kThreads)
    out[static_cast<int64_t>(blockIdx.x) * num_tokens + j] = static_cast<float>(exp(row[j] - top) / sum);
}

}  // namespace

void bidirectional_window_scores(TensorView out, TensorView queries, TensorView keys) {
  window_scores(out, queries, keys, false);
}

void group_max_attention_importance(TensorView out, TensorView queries, TensorView keys) {
  window_scores(out, queries, keys, true);
}

void key_redundancy(TensorView out, TensorView keys, float threshold) {
  const auto num_tokens = static_cast<int>(keys.shape[0]), num_kv_heads = static_cast<int>(keys.shape[1]),
             head_dim = static_cast<int>(keys.shape[2]);
  const size_t cells = static_cast<size_t>(num_kv_heads) * num_tokens;
  // Scratch: column means [Hkv, T] f64, the column parts f64, newest [Hkv, T] i32, unit keys [Hkv, T, D] f32,
  // similarities [Hkv, T, T] f32.
  const size_t mean_bytes = cells * sizeof(double);
  const size_t parts_bytes = mean_bytes * static_cast<size_t>(column_parts(num_tokens, num_tokens, num_kv_heads));
  const size_t newest_bytes = (cells * sizeof(int32_t) + 15) / 16 * 16;
  const size_t unit_bytes = cells * head_dim * sizeof(float);
  CudaContext& context = CudaContext::current();
  char* scratch = static_cast<char*>(context.scratch(mean_bytes + parts_bytes + newest_bytes + unit_bytes +
                                                     cells * static_cast<size_t>(num_tokens) * sizeof(float)));
  auto* column_mean = reinterpret_cast<double*>(scratch);
  auto* parts = reinterpret_cast<double*>(scratch + mean_bytes);
  auto* newest = reinterpret_cast<int32_t*>(scratch + mean_bytes + parts_bytes);
  auto* unit = reinterpret_cast<float*>(scratch + mean_bytes + parts_bytes + newest_bytes);
  auto* similarity = reinterpret_cast<float*>(scratch + mean_bytes + parts_bytes + newest_bytes + unit_bytes);
  unit_keys_kernel<<<dim3(static_cast<unsigned>(num_tokens), static_cast<unsigned>(num_kv_heads)), 128, 0,
                     context.stream()>>>(unit, keys.ptr<float>(), num_tokens, num_kv_heads, head_dim);
  SE_CUDA_CHECK_LAUNCH("unit_keys_kernel");
  const int64_t d = head_dim, per_head = int64_t{num_tokens} * head_dim;
  launch_row_dots(
      RowDots{unit, unit, similarity, num_tokens, num_tokens, head_dim, per_head, d, 0, 1, per_head, d, 1.0f},
      num_kv_heads);
  newest_duplicate_kernel<<<launch::grid_for(static_cast<int64_t>(cells) * 32, kThreads), kThreads, 0,
                            context.stream()>>>(newest, similarity, num_tokens, num_kv_heads, threshold);
  SE_CUDA_CHECK_LAUNCH("newest_duplicate_kernel");
  reduce_columns(column_mean, parts, Similarity{similarity, newest, num_tokens}, num_tokens, num_tokens, num_kv_heads,
                 num_tokens);
  softmax_rows_kernel<<<static_cast<unsigned>(num_kv_heads), kThreads, 0, context.stream()>>>(out.ptr<float>(),
                                                                                              column_mean, num_tokens);
  SE_CUDA_CHECK_LAUNCH("softmax_rows_kernel");
}

}  // namespace se::cuda
