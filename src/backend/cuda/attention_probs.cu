// The two-pass attention-probability kernels behind attention_scores and
// subset_attention_max_scores (see attention_probs.h). Both passes work on the same tiles: the
// query vectors of one KV head (a vector is one (query head of the group, row) pair, v = g * n + r,
// 64 per tile, fp32 in shared memory) against 64 keys (bf16 in shared memory, loaded in 16-byte
// pieces). Thread t takes key t % 64 against 16 vectors and sums each dot product over head_dim in
// the same order in both passes, so pass 2 sees the logits pass 1 normalized. Logits, exponentials
// and sums are fp32. FP8 pages (the FP8 store) are decoded into the same bf16 key tile as they are
// loaded, code x the KV head's scale.
//
// Pass 1, grid (key chunk, vector tile, KV head): each thread keeps an online (max, sum) per vector
// over its keys, merged over the block, then over the chunks by the merge kernel.
// Pass 2, grid (key tile, head set, KV head): the block loads its key tile once and walks the
// vectors of its heads 64 at a time, reducing each key's probabilities over rows in row order
// (the CPU reference's order).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cuda/attention_probs.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/fp8_e4m3.cuh"

namespace se::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kTileKeys = 64;     // keys per tile: one per thread of a group
constexpr int kTileVectors = 64;  // query vectors per tile
constexpr int kVecsPerThread = kTileVectors / (kThreads / kTileKeys);  // 16
// bf16 elements after each key row in shared memory: rows stay 8-byte aligned and the 8-byte loads
// of 16 consecutive keys hit distinct bank pairs.
constexpr int kKeyPad = 4;
constexpr int kProbStride = kTileKeys + 1;  // floats per vector row of the probability tile
constexpr int64_t kPartialBudgetBytes = int64_t{64} << 20;

struct ProbArgs {
  ProbKeys keys;
  const void* q;  // [n, H, D]
  DType q_dtype;
  const char* kv_base;
  const float* k_scales;  // FP8 pages: [Hkv] device scales; null for bf16 pages
  size_t page_bytes;
  int32_t page_size;
  int32_t num_kv_heads, group, num_rows;  // Hkv, G, n
  const int32_t* pages;                   // [Hkv][pages_stride] page list of each stream
  int32_t pages_stride;
  const int32_t* lens;   // [Hkv] tokens per stream
  const uint32_t* mask;  // [Hkv][mask_words] bit j: token j selected; null = no selection
  int32_t mask_words;
  float scale, softcap;
  int32_t window;
  bool reduce_max;
  int32_t num_sink, begin, num_range;  // kSubset
  int32_t num_keys;    // logical keys per KV head: the longest stream (kStream) or the subset size
  int32_t chunk_keys;  // keys per pass-1 block (a multiple of kTileKeys)
  int32_t heads_per_set;  // query heads per pass-2 block (kStream)
  float2* partial;        // [num_chunks][H * n] pass-1 (max, sum) per chunk
  float2* stats;          // [H * n] (max, sum) of each (head, row): index h * n + r
  float* out;             // [H, out_cols] (kStream) or [Hkv, num_range] (kSubset)
  int32_t out_cols;
};

// The stored token behind logical key t of a stream of `len` tokens.
__device__ __forceinline__ int32_t token_of(const ProbArgs& a, int32_t len, int32_t t) {
  if (a.keys == ProbKeys::kStream || t < a.num_sink) return t;
  const int32_t u = t - a.num_sink;
  return u < a.num_range ? a.begin + u : len - a.num_rows + (u - a.num_range);
}

// Whether query row r sees logical key t (token j) of KV head kvh (a stream of `len` tokens): the
// rules of cpu/visible_keys.h for kStream, the subset's causality for kSubset.
__device__ __forceinline__ bool sees(const ProbArgs& a, int kvh, int32_t len, int32_t r, int32_t t,
                                     int32_t j) {
  if (a.keys == ProbKeys::kSubset) return t < a.num_sink + a.num_range + r + 1;
  const int32_t last = len - a.num_rows + r;
  if (j > last) return false;
  if (a.window > 0 && j < last - a.window + 1) return false;
  if (a.mask != nullptr)
    return (a.mask[static_cast<int64_t>(kvh) * a.mask_words + (j >> 5)] >> (j & 31)) & 1u;
  return true;
}

__device__ __forceinline__ float to_logit(const ProbArgs& a, float dot) {
  float x = dot * a.scale;
  if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
  return x;
}

// Two (max, sum) softmax states as one; a state that saw nothing is (-inf, 0).
__device__ __forceinline__ float2 merge_stats(float2 a, float2 b) {
  const float m = fmaxf(a.x, b.x);
  if (m == -INFINITY) return make_float2(-INFINITY, 0.0f);
  return make_float2(m, a.y * expf(a.x - m) + b.y * expf(b.x - m));
}

// k_s[kk] = key t0 + kk of KV head kvh (zeros from `end` on). [kTileKeys][D + kKeyPad] bf16.
template <int D>
__device__ void load_keys(const ProbArgs& a, int kvh, const int32_t* pages, int32_t len, int32_t end, int32_t t0,
                          __nv_bfloat16* k_s) {
  constexpr int kPieces = D / 8;  // pieces of 8 elements per key row: 16 bytes of bf16, 8 of FP8 codes
  const bool fp8 = a.k_scales != nullptr;
  const float k_scale = fp8 ? a.k_scales[kvh] : 1.0f;
  const size_t element_bytes = fp8 ? 1 : sizeof(__nv_bfloat16);
  for (int i = threadIdx.x; i < kTileKeys * kPieces; i += kThreads) {
    const int kk = i / kPieces;
    const int c = i - kk * kPieces;
    const int32_t t = t0 + kk;
    uint4 piece = make_uint4(0, 0, 0, 0);
    if (t < end) {
      const int32_t j = token_of(a, len, t);
      const int32_t page_idx = j / a.page_size;
      const int32_t offset = j - page_idx * a.page_size;
      const char* src = a.kv_base + static_cast<size_t>(pages[page_idx]) * a.page_bytes +
                        (static_cast<size_t>(offset) * D + c * 8) * element_bytes;
      piece = fp8 ? fp8_e4m3x8_to_bf16x8(*reinterpret_cast<const uint2*>(src), k_scale)
                  : *reinterpret_cast<const uint4*>(src);
    }
    auto* dst = reinterpret_cast<uint2*>(k_s + kk * (D + kKeyPad) + c * 8);
    dst[0] = make_uint2(piece.x, piece.y);
    dst[1] = make_uint2(piece.z, piece.w);
  }
}

// q_s[vl] = query vector v0 + vl of KV head kvh, for vl < nv. [kTileVectors][D] fp32.
template <int D>
__device__ void load_queries(const ProbArgs& a, int kvh, int32_t v0, int nv, float* q_s) {
  const int64_t num_heads = int64_t{a.num_kv_heads} * a.group;
  for (int i = threadIdx.x; i < nv * D; i += kThreads) {
    const int vl = i / D;
    const int d = i - vl * D;
    const int32_t v = v0 + vl;
    const int32_t g = v / a.num_rows;
    const int32_t r = v - g * a.num_rows;
    q_s[i] = load_as_float(a.q, a.q_dtype, (r * num_heads + int64_t{kvh} * a.group + g) * D + d);
  }
}

// s[i] = q_s[vbase + i] . k_s[key] for i < nvec, summed over d in order.
template <int D>
__device__ __forceinline__ void tile_dots(const float* q_s, const __nv_bfloat16* k_s, int key,
                                          int vbase, int nvec, float (&s)[kVecsPerThread]) {
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) s[i] = 0.0f;
  const __nv_bfloat16* k_row = k_s + key * (D + kKeyPad);
#pragma unroll 2
  for (int d = 0; d < D; d += 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(k_row + d);
    // bf16 -> fp32 is the top half of the fp32 bits.
    const float k0 = __uint_as_float(raw.x << 16), k1 = __uint_as_float(raw.x & 0xffff0000u);
    const float k2 = __uint_as_float(raw.y << 16), k3 = __uint_as_float(raw.y & 0xffff0000u);
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      if (i < nvec) {
        const float4 qv = *reinterpret_cast<const float4*>(q_s + (vbase + i) * D + d);
        s[i] = fmaf(qv.x, k0, s[i]);
        s[i] = fmaf(qv.y, k1, s[i]);
        s[i] = fmaf(qv.z, k2, s[i]);
        s[i] = fmaf(qv.w, k3, s[i]);
      }
    }
  }
}

template <int D>
constexpr size_t stats_smem_bytes() {
  return size_t{kTileVectors} * D * sizeof(float) +
         size_t{kTileKeys} * (D + kKeyPad) * sizeof(__nv_bfloat16);
}
// heads_per_set <= kTileVectors (a set's vectors fit one tile when n < kTileVectors).
template <int D>
constexpr size_t reduce_smem_bytes(int heads_per_set) {
  return stats_smem_bytes<D>() + size_t{kTileVectors} * kProbStride * sizeof(float) +
         static_cast<size_t>(heads_per_set) * kTileKeys * sizeof(float);
}

// Pass 1. grid (chunk, vector tile, KV head): (max, sum) of each vector over the chunk's keys.
template <int D>
__global__ void __launch_bounds__(kThreads) attention_probs_stats_kernel(const ProbArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* q_s = reinterpret_cast<float*>(smem);
  auto* k_s = reinterpret_cast<__nv_bfloat16*>(q_s + kTileVectors * D);
  __shared__ float2 warp_stats[kThreads / 32][kVecsPerThread];

  const int kvh = blockIdx.z;
  const int32_t num_vectors = a.group * a.num_rows;
  const int32_t v0 = static_cast<int32_t>(blockIdx.y) * kTileVectors;
  const int nv = min(kTileVectors, num_vectors - v0);
  const int32_t len = a.lens[kvh];
  const int32_t* pages = a.pages + static_cast<int64_t>(kvh) * a.pages_stride;
  const int key = threadIdx.x % kTileKeys;
  const int vbase = (threadIdx.x / kTileKeys) * kVecsPerThread;
  const int nvec = max(0, min(kVecsPerThread, nv - vbase));
  const int32_t count = a.keys == ProbKeys::kStream ? len : a.num_keys;
  const int32_t t_begin = static_cast<int32_t>(blockIdx.x) * a.chunk_keys;
  const int32_t t_end = min(count, t_begin + a.chunk_keys);

  float m[kVecsPerThread], l[kVecsPerThread];
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  load_queries<D>(a, kvh, v0, nv, q_s);
  for (int32_t t0 = t_begin; t0 < t_end; t0 += kTileKeys) {
    __syncthreads();  // the previous tile's keys are consumed
    load_keys<D>(a, kvh, pages, len, t_end, t0, k_s);
    __syncthreads();
    float s[kVecsPerThread];
    tile_dots<D>(q_s, k_s, key, vbase, nvec, s);
    const int32_t t = t0 + key;
    if (t >= t_end) continue;
    const int32_t j = token_of(a, len, t);
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      if (i < nvec && sees(a, kvh, len, (v0 + vbase + i) % a.num_rows, t, j)) {
        const float x = to_logit(a, s[i]);
        if (x > m[i]) {
          l[i] = l[i] * expf(m[i] - x) + 1.0f;
          m[i] = x;
        } else {
          l[i] += expf(x - m[i]);
        }
      }
    }
  }
  // The 64 threads of a vector group are two whole warps: merge over lanes, then over the pair.
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < kVecsPerThread; ++i) {
    float2 st = make_float2(m[i], l[i]);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      st = merge_stats(st, make_float2(__shfl_xor_sync(0xffffffffu, st.x, offset),
                                       __shfl_xor_sync(0xffffffffu, st.y, offset)));
    if (lane == 0) warp_stats[warp][i] = st;
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < nv) {
    const int vl = threadIdx.x;
    const int group_warp = (vl / kVecsPerThread) * (kTileKeys / 32);
    const int i = vl % kVecsPerThread;
    const float2 st = merge_stats(warp_stats[group_warp][i], warp_stats[group_warp + 1][i]);
    const int64_t num_items = int64_t{a.num_kv_heads} * num_vectors;
    a.partial[blockIdx.x * num_items + int64_t{kvh} * num_vectors + v0 + vl] = st;
  }
}

// Merges the chunks' states in chunk order: stats[i] over partial[c][i].
__global__ void attention_probs_merge_kernel(const float2* partial, float2* stats, int num_chunks,
                                             int64_t num_items) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float2 st = make_float2(-INFINITY, 0.0f);
    for (int c = 0; c < num_chunks; ++c) st = merge_stats(st, partial[c * num_items + i]);
    stats[i] = st;
  }
}

// Pass 2. grid (key tile, head set, KV head): the tile's probabilities reduced over rows (kStream,
// per head) or over rows and the whole group (kSubset, max).
template <int D>
__global__ void __launch_bounds__(kThreads) attention_probs_reduce_kernel(const ProbArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* q_s = reinterpret_cast<float*>(smem);
  auto* k_s = reinterpret_cast<__nv_bfloat16*>(q_s + kTileVectors * D);
  float* p_s = reinterpret_cast<float*>(k_s + kTileKeys * (D + kKeyPad));  // [vectors][kProbStride]
  float* acc = p_s + kTileVectors * kProbStride;                           // [heads][kTileKeys]

  const int kvh = blockIdx.z;
  const bool stream = a.keys == ProbKeys::kStream;
  const int32_t n = a.num_rows;
  const int32_t len = a.lens[kvh];
  const int32_t* pages = a.pages + static_cast<int64_t>(kvh) * a.pages_stride;
  const int32_t g0 = stream ? static_cast<int32_t>(blockIdx.y) * a.heads_per_set : 0;
  const int32_t g1 = stream ? min(a.group, g0 + a.heads_per_set) : a.group;
  const int32_t t0 = (stream ? 0 : a.num_sink) + static_cast<int32_t>(blockIdx.x) * kTileKeys;
  const int32_t key_end = stream ? len : a.num_sink + a.num_range;
  const int num_acc = stream ? (g1 - g0) * kTileKeys : kTileKeys;
  const int key = threadIdx.x % kTileKeys;
  const int vbase = (threadIdx.x / kTileKeys) * kVecsPerThread;
  const int64_t stats_base = int64_t{kvh} * a.group * n;

  for (int i = threadIdx.x; i < num_acc; i += kThreads) acc[i] = 0.0f;
  if (t0 < key_end) {  // else the tile lies past this stream's end: zeros
    load_keys<D>(a, kvh, pages, len, key_end, t0, k_s);
    const int32_t t = t0 + key;
    const bool live = t < key_end;
    const int32_t j = live ? token_of(a, len, t) : 0;
    for (int32_t vs = g0 * n; vs < g1 * n; vs += kTileVectors) {
      const int nv = min(kTileVectors, g1 * n - vs);
      const int nvec = max(0, min(kVecsPerThread, nv - vbase));
      __syncthreads();  // keys loaded; the previous vectors' q_s and p_s consumed
      load_queries<D>(a, kvh, vs, nv, q_s);
      __syncthreads();
      float s[kVecsPerThread];
      tile_dots<D>(q_s, k_s, key, vbase, nvec, s);
#pragma unroll
      for (int i = 0; i < kVecsPerThread; ++i) {
        if (i < nvec) {
          const int32_t v = vs + vbase + i;
          float p = 0.0f;
          if (live && sees(a, kvh, len, v % n, t, j)) {
            const float2 st = a.stats[stats_base + v];
            p = expf(to_logit(a, s[i]) - st.x) / st.y;
          }
          p_s[(vbase + i) * kProbStride + key] = p;
        }
      }
      __syncthreads();
      // Each accumulator stays with one thread across iterations (same stride walk).
      if (stream) {
        for (int pair = threadIdx.x; pair < num_acc; pair += kThreads) {
          const int32_t g = g0 + pair / kTileKeys;
          const int kk = pair % kTileKeys;
          const int32_t va = max(vs, g * n), vb = min(vs + nv, (g + 1) * n);
          float o = acc[pair];
          for (int32_t v = va; v < vb; ++v) {
            const float p = p_s[(v - vs) * kProbStride + kk];
            o = a.reduce_max ? fmaxf(o, p) : o + p;
          }
          acc[pair] = o;
        }
      } else {
        for (int kk = threadIdx.x; kk < kTileKeys; kk += kThreads) {
          float o = acc[kk];
          for (int vl = 0; vl < nv; ++vl) o = fmaxf(o, p_s[vl * kProbStride + kk]);
          acc[kk] = o;
        }
      }
    }
  }
  __syncthreads();
  if (stream) {
    for (int pair = threadIdx.x; pair < num_acc; pair += kThreads) {
      const int32_t col = t0 + pair % kTileKeys;
      const int64_t h = int64_t{kvh} * a.group + g0 + pair / kTileKeys;
      if (col < a.out_cols) a.out[h * a.out_cols + col] = acc[pair];
    }
  } else {
    for (int kk = threadIdx.x; kk < kTileKeys; kk += kThreads) {
      const int32_t col = static_cast<int32_t>(blockIdx.x) * kTileKeys + kk;
      if (col < a.num_range) a.out[int64_t{kvh} * a.num_range + col] = acc[kk];
    }
  }
}

template <int D>
void launch_passes(const ProbArgs& a, int num_chunks, int64_t num_items) {
  static const bool configured = [] {
    SE_CUDA_CHECK(cudaFuncSetAttribute(attention_probs_stats_kernel<D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(stats_smem_bytes<D>())));
    SE_CUDA_CHECK(cudaFuncSetAttribute(attention_probs_reduce_kernel<D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(reduce_smem_bytes<D>(kTileVectors))));
    return true;
  }();
  (void)configured;
  cudaStream_t stream = CudaContext::current().stream();
  const int num_vectors = a.group * a.num_rows;
  const dim3 stats_grid(static_cast<unsigned>(num_chunks),
                        static_cast<unsigned>(launch::ceil_div(num_vectors, kTileVectors)),
                        static_cast<unsigned>(a.num_kv_heads));
  attention_probs_stats_kernel<D><<<stats_grid, kThreads, stats_smem_bytes<D>(), stream>>>(a);
  SE_CUDA_CHECK_LAUNCH("attention_probs_stats_kernel");
  if (num_chunks > 1) {
    attention_probs_merge_kernel<<<launch::grid_for(num_items, 256), 256, 0, stream>>>(
        a.partial, a.stats, num_chunks, num_items);
    SE_CUDA_CHECK_LAUNCH("attention_probs_merge_kernel");
  }
  const bool by_head = a.keys == ProbKeys::kStream;
  const int64_t cols = by_head ? a.out_cols : a.num_range;
  const dim3 reduce_grid(
      static_cast<unsigned>(launch::ceil_div(cols, kTileKeys)),
      static_cast<unsigned>(by_head ? launch::ceil_div(a.group, a.heads_per_set) : 1),
      static_cast<unsigned>(a.num_kv_heads));
  attention_probs_reduce_kernel<D>
      <<<reduce_grid, kThreads, reduce_smem_bytes<D>(by_head ? a.heads_per_set : 1), stream>>>(a);
  SE_CUDA_CHECK_LAUNCH("attention_probs_reduce_kernel");
}

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

void run_attention_probs(const AttentionProbsJob& job, const AttentionView& view, int32_t slice) {
  const SeqKvView& sv = view.seqs[slice];
  const int32_t n = static_cast<int32_t>(job.q.shape[0]);
  const int32_t num_heads = static_cast<int32_t>(job.q.shape[1]);
  const int32_t num_kv_heads = view.num_kv_heads;
  const bool stream = job.keys == ProbKeys::kStream;
  const int64_t out_elems =
      stream ? int64_t{num_heads} * job.out_cols : int64_t{num_kv_heads} * job.num_range;
  if (n == 0 || out_elems == 0) {  // no rows: nothing is seen
    std::fill(job.out, job.out + out_elems, 0.0f);
    return;
  }
  SE_CHECK(view.head_dim == 64 || view.head_dim == 128 || view.head_dim == 256,
           "cuda attention probabilities: head_dim {} (64, 128 or 256)", view.head_dim);
  SE_CHECK(reinterpret_cast<uintptr_t>(view.kv_base) % 16 == 0 && view.page_bytes % 16 == 0,
           "cuda attention probabilities: the KV base and page_bytes must be 16-byte aligned");
  CudaContext& context = CudaContext::current();

  // Host tables, packed for one copy: the page list of every stream (padded to the longest), the
  // stream lengths and, with a selection, a bitmask of the selected tokens of each stream.
  int32_t max_len = 0;
  for (int32_t h = 0; h < num_kv_heads; ++h) max_len = std::max(max_len, sv.num_tokens[h]);
  const int32_t pages_stride = static_cast<int32_t>(launch::ceil_div(max_len, view.page_size));
  const bool masked = stream && sv.selected != nullptr;
  const int32_t mask_words = masked ? static_cast<int32_t>(launch::ceil_div(max_len, 32)) : 0;
  thread_local std::vector<int32_t> tables;
  tables.assign(static_cast<size_t>(num_kv_heads) * (pages_stride + 1 + mask_words), 0);
  int32_t* lens = tables.data() + static_cast<size_t>(num_kv_heads) * pages_stride;
  auto* mask = reinterpret_cast<uint32_t*>(lens + num_kv_heads);
  for (int32_t h = 0; h < num_kv_heads; ++h) {
    const int32_t len = sv.num_tokens[h];
    lens[h] = len;
    std::copy_n(sv.page_ids + static_cast<int64_t>(h) * sv.stride,
                launch::ceil_div(len, view.page_size),
                tables.data() + static_cast<size_t>(h) * pages_stride);
    if (!masked) continue;
    const int32_t* sel = sv.selected + static_cast<int64_t>(h) * sv.selected_stride;
    const int32_t unit = view.selection_unit == SelectionUnit::kPage ? view.page_size : 1;
    uint32_t* words = mask + static_cast<size_t>(h) * mask_words;
    for (int32_t i = 0; i < sv.num_selected[h]; ++i) {
      const int64_t lo = std::max<int64_t>(0, int64_t{sel[i]} * unit);
      const int64_t hi = std::min<int64_t>(len, int64_t{sel[i]} * unit + unit);
      for (int64_t j = lo; j < hi; ++j) words[j >> 5] |= 1u << (j & 31);
    }
  }

  ProbArgs a{};
  a.keys = job.keys;
  a.q = job.q.data;
  a.q_dtype = job.q.dtype;
  a.kv_base = static_cast<const char*>(view.kv_base);
  if (view.payload == KvPayload::kQuantized) a.k_scales = view.quantized.k_scales;  // FP8: ops.cpp admits no other
  a.page_bytes = view.page_bytes;
  a.page_size = view.page_size;
  a.num_kv_heads = num_kv_heads;
  a.group = num_heads / num_kv_heads;
  a.num_rows = n;
  a.pages_stride = pages_stride;
  a.mask_words = mask_words;
  a.scale = job.params.scale;
  a.softcap = job.params.logit_softcap;
  a.window = stream ? job.params.sliding_window : 0;
  a.reduce_max = !stream || job.reduce == ScoreReduce::kMax;
  a.num_sink = job.num_sink;
  a.begin = job.begin;
  a.num_range = job.num_range;
  a.num_keys = stream ? max_len : job.num_sink + job.num_range + n;
  a.out_cols = job.out_cols;
  // A head set's vectors fill one tile when rows are few (decode: the whole group at once).
  a.heads_per_set = n >= kTileVectors ? 1 : std::min(a.group, kTileVectors / n);

  // Pass-1 chunks: enough blocks for a few waves, within the partial-state budget.
  const int64_t num_items = int64_t{num_heads} * n;
  const int64_t vector_tiles = launch::ceil_div(int64_t{a.group} * n, kTileVectors);
  SE_CHECK(vector_tiles <= 65535, "cuda attention probabilities: {} rows x {} heads per KV head", n,
           a.group);
  const int64_t key_tiles = launch::ceil_div(a.num_keys, kTileKeys);
  const int64_t target_blocks = int64_t{4} * context.props().multiProcessorCount;
  int64_t num_chunks =
      std::clamp<int64_t>(launch::ceil_div(target_blocks, vector_tiles * num_kv_heads), 1,
                          std::max<int64_t>(key_tiles, 1));
  num_chunks = std::min(num_chunks, std::max<int64_t>(1, kPartialBudgetBytes / (num_items * 8)));
  const int64_t chunk_tiles = launch::ceil_div(std::max<int64_t>(key_tiles, 1), num_chunks);
  num_chunks = launch::ceil_div(std::max<int64_t>(key_tiles, 1), chunk_tiles);
  a.chunk_keys = static_cast<int32_t>(chunk_tiles * kTileKeys);

  // Device scratch: [tables | partial states (several chunks) | states | output].
  const size_t table_bytes = align_up(tables.size() * sizeof(int32_t));
  const size_t partial_bytes =
      num_chunks > 1 ? align_up(static_cast<size_t>(num_chunks * num_items) * 8) : 0;
  const size_t stats_bytes = align_up(static_cast<size_t>(num_items) * 8);
  const size_t out_bytes = static_cast<size_t>(out_elems) * sizeof(float);
  char* scratch =
      static_cast<char*>(context.scratch(table_bytes + partial_bytes + stats_bytes + out_bytes));
  const auto* d_tables = reinterpret_cast<const int32_t*>(scratch);
  a.pages = d_tables;
  a.lens = d_tables + static_cast<size_t>(num_kv_heads) * pages_stride;
  a.mask = masked ? reinterpret_cast<const uint32_t*>(a.lens + num_kv_heads) : nullptr;
  a.stats = reinterpret_cast<float2*>(scratch + table_bytes + partial_bytes);
  a.partial = num_chunks > 1 ? reinterpret_cast<float2*>(scratch + table_bytes) : a.stats;
  a.out = reinterpret_cast<float*>(scratch + table_bytes + partial_bytes + stats_bytes);

  // Through the pinned ring: a copy from pageable memory would wait for the stream first.
  const size_t tables_bytes = tables.size() * sizeof(int32_t);
  void* pinned = context.host_staging(tables_bytes);
  std::memcpy(pinned, tables.data(), tables_bytes);
  SE_CUDA_CHECK(
      cudaMemcpyAsync(scratch, pinned, tables_bytes, cudaMemcpyHostToDevice, context.stream()));
  switch (view.head_dim) {
    case 64:
      launch_passes<64>(a, static_cast<int>(num_chunks), num_items);
      break;
    case 128:
      launch_passes<128>(a, static_cast<int>(num_chunks), num_items);
      break;
    default:
      launch_passes<256>(a, static_cast<int>(num_chunks), num_items);
      break;
  }
  // The scratch may serve the next op at once: stream order runs this copy before it is overwritten.
  SE_CUDA_CHECK(
      cudaMemcpyAsync(job.out, a.out, out_bytes, cudaMemcpyDeviceToHost, context.stream()));
  if (job.ready == ScoresReady::kOnReturn) context.synchronize();
}

}  // namespace se::cuda
