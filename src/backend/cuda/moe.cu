// The mixture-of-experts kernels (backend/moe_ops.h on CUDA). Simple by design: one thread per row for the
// router, one block for the grouping, a shared-memory tiled GEMM whose grid spans every expert (blocks past an
// expert's row count return before reading its weights), one block per row for the weighted sum.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/moe.h"

namespace se::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 16;  // grouped_linear: a block computes a kTile x kTile tile of one expert's rows
// group_by_expert keeps a count per expert in shared memory (the default 48 KiB of it).
constexpr int64_t kMaxExperts = 48 * 1024 / sizeof(int32_t) - 1;

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// One thread per row: softmax over the experts, then k picks, each the most probable expert ordered after the
// previous pick (descending probability, ties to the lower index), as the CPU reference's partial sort orders them.
__global__ void route_kernel(int32_t* experts, float* weights, const float* logits, int64_t t, int num_experts, int k,
                             bool normalize) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (row >= t) return;
  const float* logit = logits + row * num_experts;
  float max_logit = logit[0];
  for (int e = 1; e < num_experts; ++e) max_logit = fmaxf(max_logit, logit[e]);
  float sum = 0.0f;
  for (int e = 0; e < num_experts; ++e) sum += expf(logit[e] - max_logit);
  int prev = -1;
  float prev_p = 0.0f, chosen = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_p = -1.0f;
    for (int e = 0; e < num_experts; ++e) {
      const float p = expf(logit[e] - max_logit) / sum;
      const bool after_prev = prev < 0 || p < prev_p || (p == prev_p && e > prev);
      if (after_prev && p > best_p) {
        best = e;
        best_p = p;
      }
    }
    experts[row * k + j] = best;
    weights[row * k + j] = best_p;
    chosen += best_p;
    prev = best;
    prev_p = best_p;
  }
  if (normalize)
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

// One block per row r: h[r] += sum_j weights[r, j] * y[slots[r * k + j]], j in order.
__global__ void combine_kernel(float* h, const float* y, const float* weights, const int32_t* slots, int64_t hidden,
                               int k) {
  const int64_t r = blockIdx.x;
  for (int64_t d = threadIdx.x; d < hidden; d += blockDim.x) {
    float v = h[r * hidden + d];
    for (int j = 0; j < k; ++j) v += weights[r * k + j] * y[static_cast<int64_t>(slots[r * k + j]) * hidden + d];
    h[r * hidden + d] = v;
  }
}

}  // namespace

void route_experts(TensorView experts, TensorView weights, TensorView logits, bool normalize) {
  const int64_t t = logits.shape[0];
  route_kernel<<<blocks_for(t, kThreads), kThreads, 0, CudaContext::current().stream()>>>(
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

void grouped_linear(TensorView out, TensorView x, TensorView w, TensorView offsets, int64_t max_rows) {
  const int64_t num_experts = w.shape[0], n = w.shape[1], k = w.shape[2];
  if (max_rows == 0 || num_experts == 0) return;
  const dim3 grid(blocks_for(n, kTile), blocks_for(max_rows, kTile), static_cast<unsigned>(num_experts));
  grouped_linear_kernel<<<grid, dim3(kTile, kTile), 0, CudaContext::current().stream()>>>(
      out.data, out.dtype, x.data, w.data, x.dtype, offsets.ptr<int32_t>(), n, k);
  SE_CUDA_CHECK_LAUNCH("grouped_linear_kernel");
}

void moe_combine(TensorView h, TensorView y, TensorView weights, TensorView slots) {
  combine_kernel<<<static_cast<unsigned>(h.shape[0]), kThreads, 0, CudaContext::current().stream()>>>(
      h.ptr<float>(), y.ptr<float>(), weights.ptr<float>(), slots.ptr<int32_t>(), h.shape[1],
      static_cast<int>(weights.shape[1]));
  SE_CUDA_CHECK_LAUNCH("combine_kernel");
}

}  // namespace se::cuda
