// CUDA twins of the decode-time compression scores (the CPU references are backend/cpu/decode_window_scores.cpp):
// plain kernels that follow the CPU's loops, with double dot products and softmaxes, so only the summation order
// of the reductions across threads (and exp's last bits) differ. Scratch from CudaContext::scratch; out, queries
// and keys on the device.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"

namespace se::cuda {

namespace {

constexpr int kThreads = 256;

__device__ double dot(const float* a, const float* b, int n) {
  double acc = 0;
  for (int i = 0; i < n; ++i) acc += static_cast<double>(a[i]) * b[i];
  return acc;
}

// The block's max (kMax) or sum of v; every thread gets it. kThreads threads.
template <bool kMax>
__device__ double block_reduce(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] = kMax ? fmax(shared[threadIdx.x], shared[threadIdx.x + stride])
                                 : shared[threadIdx.x] + shared[threadIdx.x + stride];
    __syncthreads();
  }
  const double result = shared[0];
  __syncthreads();
  return result;
}

struct WindowDims {
  int rows, num_heads, num_kv_heads, head_dim, n, group;
};

// The logit of key j in softmax row (r, a): a is a query head (kGroupMax false) or a KV head whose group's
// logits are max-pooled (kGroupMax true).
template <bool kGroupMax>
__device__ double row_logit(const float* queries, const float* keys, const WindowDims& d, double scale, int r, int a,
                            int j) {
  if (!kGroupMax) {
    const float* q = queries + (static_cast<int64_t>(r) * d.num_heads + a) * d.head_dim;
    return dot(q, keys + (static_cast<int64_t>(j) * d.num_kv_heads + a / d.group) * d.head_dim, d.head_dim) * scale;
  }
  double best = -INFINITY;
  for (int g = 0; g < d.group; ++g) {
    const float* q = queries + (static_cast<int64_t>(r) * d.num_heads + a * d.group + g) * d.head_dim;
    best = fmax(best, dot(q, keys + (static_cast<int64_t>(j) * d.num_kv_heads + a) * d.head_dim, d.head_dim) * scale);
  }
  return best;
}

// Block (r, a): the max and the sum of exp(logit - max) of softmax row (r, a), at stats[2 * (r * rows_a + a)].
template <bool kGroupMax>
__global__ void __launch_bounds__(kThreads)
    row_stats_kernel(double* stats, const float* queries, const float* keys, WindowDims d, double scale) {
  __shared__ double shared[kThreads];
  const int r = blockIdx.x, a = blockIdx.y;
  double top = -INFINITY;
  for (int j = threadIdx.x; j < d.n; j += kThreads)
    top = fmax(top, row_logit<kGroupMax>(queries, keys, d, scale, r, a, j));
  top = block_reduce<true>(top, shared);
  double sum = 0;
  for (int j = threadIdx.x; j < d.n; j += kThreads)
    sum += exp(row_logit<kGroupMax>(queries, keys, d, scale, r, a, j) - top);
  sum = block_reduce<false>(sum, shared);
  if (threadIdx.x == 0) {
    stats[2 * (static_cast<int64_t>(r) * gridDim.y + a)] = top;
    stats[2 * (static_cast<int64_t>(r) * gridDim.y + a) + 1] = sum;
  }
}

// Thread (KV head h, key j): the mean of the probabilities of j over the rows (and query heads) of h.
template <bool kGroupMax>
__global__ void __launch_bounds__(kThreads)
    mean_probability_kernel(float* out, const double* stats, const float* queries, const float* keys, WindowDims d,
                            double scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(d.num_kv_heads) * d.n) return;
  const int h = static_cast<int>(i / d.n), j = static_cast<int>(i % d.n);
  const int heads_per_row = kGroupMax ? 1 : d.group;  // softmax rows of h per query row
  const int rows_a = kGroupMax ? d.num_kv_heads : d.num_heads;
  double acc = 0;
  for (int g = 0; g < heads_per_row; ++g) {
    const int a = kGroupMax ? h : h * d.group + g;
    for (int r = 0; r < d.rows; ++r) {
      const double* s = stats + 2 * (static_cast<int64_t>(r) * rows_a + a);
      acc += exp(row_logit<kGroupMax>(queries, keys, d, scale, r, a, j) - s[0]) / s[1];
    }
  }
  out[i] = static_cast<float>(acc / (static_cast<double>(d.rows) * heads_per_row));
}

template <bool kGroupMax>
void window_scores(TensorView out, TensorView queries, TensorView keys) {
  const WindowDims d{static_cast<int>(queries.shape[0]), static_cast<int>(queries.shape[1]),
                     static_cast<int>(keys.shape[1]),    static_cast<int>(keys.shape[2]),
                     static_cast<int>(keys.shape[0]),    static_cast<int>(queries.shape[1] / keys.shape[1])};
  const double scale = 1.0 / sqrt(static_cast<double>(d.head_dim));
  const int rows_a = kGroupMax ? d.num_kv_heads : d.num_heads;
  CudaContext& context = CudaContext::current();
  auto* stats = static_cast<double*>(context.scratch(sizeof(double) * 2 * static_cast<size_t>(d.rows) * rows_a));
  row_stats_kernel<kGroupMax>
      <<<dim3(static_cast<unsigned>(d.rows), static_cast<unsigned>(rows_a)), kThreads, 0, context.stream()>>>(
          stats, queries.ptr<float>(), keys.ptr<float>(), d, scale);
  SE_CUDA_CHECK_LAUNCH("row_stats_kernel");
  const int64_t total = static_cast<int64_t>(d.num_kv_heads) * d.n;
  mean_probability_kernel<kGroupMax>
      <<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, context.stream()>>>(
          out.ptr<float>(), stats, queries.ptr<float>(), keys.ptr<float>(), d, scale);
  SE_CUDA_CHECK_LAUNCH("mean_probability_kernel");
}

// Block (t, h): unit[h][t] = k / (|k| + 1e-8), rounded to f32 as the CPU's.
__global__ void __launch_bounds__(kThreads)
    unit_keys_kernel(float* unit, const float* keys, int num_tokens, int num_kv_heads, int head_dim) {
  __shared__ double shared[kThreads];
  const int t = blockIdx.x, h = blockIdx.y;
  const float* k = keys + (static_cast<int64_t>(t) * num_kv_heads + h) * head_dim;
  // The CPU sums the squares in order; one thread does the same here.
  double norm = 0;
  if (threadIdx.x == 0) norm = sqrt(dot(k, k, head_dim)) + 1e-8;
  norm = block_reduce<false>(norm, shared);
  float* u = unit + (static_cast<int64_t>(h) * num_tokens + t) * head_dim;
  for (int c = threadIdx.x; c < head_dim; c += kThreads) u[c] = static_cast<float>(k[c] / norm);
}

// Block (i, h): newest[h][i] = the largest j with S[i, j] > threshold (S[i, i] = 0), or 0.
__global__ void __launch_bounds__(kThreads)
    newest_duplicate_kernel(int32_t* newest, const float* unit, int num_tokens, int head_dim, float threshold) {
  __shared__ double shared[kThreads];
  const int i = blockIdx.x, h = blockIdx.y;
  const float* base = unit + static_cast<int64_t>(h) * num_tokens * head_dim;
  double found = -1;
  for (int j = threadIdx.x; j < num_tokens; j += kThreads) {
    const double s =
        j == i ? 0.0
               : dot(base + static_cast<int64_t>(i) * head_dim, base + static_cast<int64_t>(j) * head_dim, head_dim);
    if (s > threshold) found = fmax(found, static_cast<double>(j));
  }
  found = block_reduce<true>(found, shared);
  if (threadIdx.x == 0) newest[static_cast<int64_t>(h) * num_tokens + i] = found < 0 ? 0 : static_cast<int32_t>(found);
}

// Thread (h, j): column_mean[h][j] = the mean over rows i of S[i, j], without the diagonal and each row's newest
// near-duplicate.
__global__ void __launch_bounds__(kThreads)
    column_mean_kernel(double* column_mean, const float* unit, const int32_t* newest, int num_tokens, int num_kv_heads,
                       int head_dim) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (index >= static_cast<int64_t>(num_kv_heads) * num_tokens) return;
  const int h = static_cast<int>(index / num_tokens), j = static_cast<int>(index % num_tokens);
  const float* base = unit + static_cast<int64_t>(h) * num_tokens * head_dim;
  double sum = 0;
  for (int i = 0; i < num_tokens; ++i)
    if (i != j && newest[static_cast<int64_t>(h) * num_tokens + i] != j)
      sum += dot(base + static_cast<int64_t>(i) * head_dim, base + static_cast<int64_t>(j) * head_dim, head_dim);
  column_mean[index] = sum / num_tokens;
}

// Block h: out[h] = softmax of column_mean[h].
__global__ void __launch_bounds__(kThreads) softmax_rows_kernel(float* out, const double* column_mean, int num_tokens) {
  __shared__ double shared[kThreads];
  const double* row = column_mean + static_cast<int64_t>(blockIdx.x) * num_tokens;
  double top = -INFINITY;
  for (int j = threadIdx.x; j < num_tokens; j += kThreads) top = fmax(top, row[j]);
  top = block_reduce<true>(top, shared);
  double sum = 0;
  for (int j = threadIdx.x; j < num_tokens; j += kThreads) sum += exp(row[j] - top);
  sum = block_reduce<false>(sum, shared);
  for (int j = threadIdx.x; j < num_tokens; j += kThreads)
    out[static_cast<int64_t>(blockIdx.x) * num_tokens + j] = static_cast<float>(exp(row[j] - top) / sum);
}

}  // namespace

void bidirectional_window_scores(TensorView out, TensorView queries, TensorView keys) {
  window_scores<false>(out, queries, keys);
}

void group_max_attention_importance(TensorView out, TensorView queries, TensorView keys) {
  window_scores<true>(out, queries, keys);
}

void key_redundancy(TensorView out, TensorView keys, float threshold) {
  const auto num_tokens = static_cast<int>(keys.shape[0]), num_kv_heads = static_cast<int>(keys.shape[1]),
             head_dim = static_cast<int>(keys.shape[2]);
  const size_t cells = static_cast<size_t>(num_kv_heads) * num_tokens;
  // Scratch: unit keys [Hkv, T, D] f32, newest [Hkv, T] i32, column means [Hkv, T] f64 (8-byte aligned first).
  const size_t mean_bytes = cells * sizeof(double), newest_bytes = (cells * sizeof(int32_t) + 7) / 8 * 8;
  CudaContext& context = CudaContext::current();
  char* scratch = static_cast<char*>(context.scratch(mean_bytes + newest_bytes + cells * head_dim * sizeof(float)));
  auto* column_mean = reinterpret_cast<double*>(scratch);
  auto* newest = reinterpret_cast<int32_t*>(scratch + mean_bytes);
  auto* unit = reinterpret_cast<float*>(scratch + mean_bytes + newest_bytes);
  const dim3 per_token(static_cast<unsigned>(num_tokens), static_cast<unsigned>(num_kv_heads));
  unit_keys_kernel<<<per_token, kThreads, 0, context.stream()>>>(unit, keys.ptr<float>(), num_tokens, num_kv_heads,
                                                                 head_dim);
  SE_CUDA_CHECK_LAUNCH("unit_keys_kernel");
  newest_duplicate_kernel<<<per_token, kThreads, 0, context.stream()>>>(newest, unit, num_tokens, head_dim, threshold);
  SE_CUDA_CHECK_LAUNCH("newest_duplicate_kernel");
  column_mean_kernel<<<static_cast<unsigned>((cells + kThreads - 1) / kThreads), kThreads, 0, context.stream()>>>(
      column_mean, unit, newest, num_tokens, num_kv_heads, head_dim);
  SE_CUDA_CHECK_LAUNCH("column_mean_kernel");
  softmax_rows_kernel<<<static_cast<unsigned>(num_kv_heads), kThreads, 0, context.stream()>>>(out.ptr<float>(),
                                                                                              column_mean, num_tokens);
  SE_CUDA_CHECK_LAUNCH("softmax_rows_kernel");
}

}  // namespace se::cuda
