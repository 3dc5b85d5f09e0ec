// Multi-head latent attention over a shared latent store (kSharedLatent) on the GPU, the twin of the CPU op, as
// FlashMLA splits it: every query head reads the same one row per token, so a CTA takes 16 query vectors of one
// sequence (the heads of a decode row, or several rows of a prefill chunk when the heads are fewer) and reads each
// page once for all of them. Per tile of 32 keys the CTA stages the bf16 rows [c ; k_rope] in shared memory; each
// warp scores its two query vectors against the tile (one key per lane, the fp32 queries broadcast from shared
// memory), steps their online softmax, and then every thread accumulates P . c for two latent columns of all 16
// vectors. The keys a CTA walks are split over the grid's z when the batch alone cannot fill the GPU, and a combine
// pass merges the splits. Last, head_gemm applies each head's W_uv to its latent output. fp32 math over bf16 pages.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/latent_head_gemm.h"
#include "backend/cuda/paged_attention_args.h"

namespace se::cuda {

namespace {

using attention_tile::bf16;
using attention_tile::KeyMap;
using attention_tile::kLog2e;
using attention_tile::QueryTile;

constexpr int kVectors = 16;   // query vectors (row, head) per CTA
constexpr int kTileKeys = 32;  // one key per lane when scoring
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kVectorsPerWarp = kVectors / kWarps;
constexpr int kMaxRank = 512;
constexpr int kLatentColumns = kMaxRank / kThreads;  // latent columns a thread accumulates
constexpr int kMaxWidth = 1024;
constexpr int kMaxSplits = 64;
constexpr int64_t kPartialBudgetBytes = int64_t{256} << 20;

struct LatentAttentionArgs {
  PagedAttentionArgs tile;  // q: the absorbed queries; part_o [splits, T, H, rank] when split
  float* o_latent;          // [T, H, rank]: the softmax-weighted latents, written when not split
  int32_t width, rank;
};

// Shared memory: the queries [kVectors][width] f32, the tile's probabilities [kTileKeys][kVectors] (a key's 16 read
// as four float4) and rescale factors [kVectors], then the key rows [kTileKeys][width + 2] bf16 (the padding staggers
// the rows' banks).
size_t shared_bytes(int width) {
  return (size_t{kVectors} * width + kVectors * kTileKeys + kVectors) * sizeof(float) +
         size_t{kTileKeys} * (width + 2) * sizeof(bf16);
}

__global__ void __launch_bounds__(kThreads) paged_latent_attention_kernel(const LatentAttentionArgs la) {
  const PagedAttentionArgs& a = la.tile;
  extern __shared__ float smem[];
  const int width = la.width, rank = la.rank, row_stride = width + 2;
  float* q_s = smem;
  float* p_s = q_s + kVectors * width;
  float* alpha_s = p_s + kVectors * kTileKeys;
  bf16* k_s = reinterpret_cast<bf16*>(alpha_s + kVectors);
  __shared__ float2 ml_s[kVectors];

  int slice = 0, tile_in_seq = 0;
  if (!attention_tile::find_tile(a, static_cast<int>(blockIdx.x), slice, tile_in_seq)) return;
  const QueryTile t(a, slice, tile_in_seq);
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;

  for (int i = threadIdx.x; i < kVectors * width; i += kThreads) {
    const int v = i / width;
    int row, head;
    q_s[i] = t.query_vector<kVectors>(a, v, row, head)
                 ? load_as_float(a.q, a.q_dtype, (int64_t{row} * a.num_heads + head) * width + (i - v * width))
                 : 0.0f;
  }
  // The keys this warp's vectors see: [lo, hi] (empty for padding).
  int32_t lo[kVectorsPerWarp], hi[kVectorsPerWarp];
#pragma unroll
  for (int i = 0; i < kVectorsPerWarp; ++i) {
    int row, head;
    lo[i] = 1;
    hi[i] = 0;
    if (t.query_vector<kVectors>(a, warp * kVectorsPerWarp + i, row, head)) {
      hi[i] = t.len - t.n + (row - t.row0);
      lo[i] = a.window > 0 ? max(0, hi[i] - a.window + 1) : 0;
    }
  }
  KeyMap keys{nullptr, 1};
  int32_t begin = 0, end = 0;
  const SelectedEntries selected = a.select_unit > 0
                                       ? selected_entries(a.produced, a.seqs[slice], slice, 0, a.num_kv_heads)
                                       : SelectedEntries{nullptr, 0};
  if (selected.entries != nullptr) {
    keys = KeyMap{selected.entries, a.select_unit};
    end = selected.count * a.select_unit;
  } else {
    t.visible_keys(a, begin, end);
  }
  int32_t split_begin, split_end;
  attention_tile::split_keys<kTileKeys>(a, begin, end, split_begin, split_end);

  float m[kVectorsPerWarp], l[kVectorsPerWarp];
#pragma unroll
  for (int i = 0; i < kVectorsPerWarp; ++i) m[i] = -INFINITY, l[i] = 0.0f;
  float acc[kVectors][kLatentColumns] = {};
  const int chunks = width / 8;
  for (int32_t k0 = split_begin; k0 < split_end; k0 += kTileKeys) {
    __syncthreads();  // the previous tile's rows and probabilities have been read
    for (int i = threadIdx.x; i < kTileKeys * chunks; i += kThreads) {
      const int r = i / chunks, c = i - r * chunks;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (k0 + r < split_end) {
        const int32_t token = keys.token(k0 + r);
        if (token < t.len) {
          const char* page = a.kv_base + static_cast<size_t>(t.pages[token / a.page_size]) * a.page_bytes;
          v = reinterpret_cast<const uint4*>(page + static_cast<size_t>(token % a.page_size) * width * 2)[c];
        }
      }
      uint32_t* dst = reinterpret_cast<uint32_t*>(k_s + r * row_stride + c * 8);
      dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    }
    __syncthreads();

    const int32_t token = k0 + lane < split_end ? keys.token(k0 + lane) : -1;
    float s[kVectorsPerWarp] = {};
    const auto* key = reinterpret_cast<const __nv_bfloat162*>(k_s + lane * row_stride);
    for (int d = 0; d < width / 2; ++d) {
      const float2 k = __bfloat1622float2(key[d]);
#pragma unroll
      for (int i = 0; i < kVectorsPerWarp; ++i) {
        const float2 q = reinterpret_cast<const float2*>(q_s + (warp * kVectorsPerWarp + i) * width)[d];
        s[i] = fmaf(q.x, k.x, fmaf(q.y, k.y, s[i]));
      }
    }
#pragma unroll
    for (int i = 0; i < kVectorsPerWarp; ++i) {
      float x = a.softcap > 0.0f ? a.softcap * tanhf(s[i] * a.scale / a.softcap) * kLog2e : s[i] * a.scale * kLog2e;
      x = token >= lo[i] && token <= hi[i] ? x : -INFINITY;
      float tile_max = x;
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      const float m_new = fmaxf(m[i], tile_max);
      const float shift = m_new == -INFINITY ? 0.0f : m_new;  // a vector that has seen no key keeps p = 0
      const float p = exp2f(x - shift);
      const float alpha = exp2f(m[i] - shift);
      l[i] = l[i] * alpha + warp_sum(p);
      m[i] = m_new;
      const int v = warp * kVectorsPerWarp + i;
      p_s[lane * kVectors + v] = p;
      if (lane == 0) alpha_s[v] = alpha;
    }
    __syncthreads();

#pragma unroll
    for (int v = 0; v < kVectors; ++v)
#pragma unroll
      for (int c = 0; c < kLatentColumns; ++c) acc[v][c] *= alpha_s[v];
    for (int r = 0; r < kTileKeys; ++r) {
      float latent[kLatentColumns];
#pragma unroll
      for (int c = 0; c < kLatentColumns; ++c) {
        const int col = threadIdx.x + c * kThreads;
        latent[c] = col < rank ? __bfloat162float(k_s[r * row_stride + col]) : 0.0f;
      }
      float p[kVectors];
#pragma unroll
      for (int v = 0; v < kVectors; v += 4) {
        const float4 four = reinterpret_cast<const float4*>(p_s + r * kVectors)[v / 4];
        p[v] = four.x, p[v + 1] = four.y, p[v + 2] = four.z, p[v + 3] = four.w;
      }
#pragma unroll
      for (int v = 0; v < kVectors; ++v)
#pragma unroll
        for (int c = 0; c < kLatentColumns; ++c) acc[v][c] = fmaf(p[v], latent[c], acc[v][c]);
    }
  }

  if (lane == 0)
#pragma unroll
    for (int i = 0; i < kVectorsPerWarp; ++i) ml_s[warp * kVectorsPerWarp + i] = make_float2(m[i], l[i]);
  __syncthreads();
  const int64_t items = int64_t{a.num_rows} * a.num_heads;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    int row, head;
    if (!t.query_vector<kVectors>(a, v, row, head)) continue;
    const int64_t item = int64_t{row} * a.num_heads + head;
    const float2 ml = ml_s[v];
    if (a.num_splits > 1) {
      const int64_t part = blockIdx.z * items + item;
      if (threadIdx.x == 0) a.part_ml[part] = ml;
#pragma unroll
      for (int c = 0; c < kLatentColumns; ++c) {
        const int col = threadIdx.x + c * kThreads;
        if (col < rank) a.part_o[part * rank + col] = acc[v][c];
      }
    } else {
      const float inv_l = ml.y > 0.0f ? 1.0f / ml.y : 0.0f;
#pragma unroll
      for (int c = 0; c < kLatentColumns; ++c) {
        const int col = threadIdx.x + c * kThreads;
        if (col < rank) la.o_latent[item * rank + col] = acc[v][c] * inv_l;
      }
    }
  }
}

// One block per (row, head): the splits' partial sums weighted by 2^(m_s - max m), over their weighted
// denominators.
__global__ void combine_latent_splits_kernel(const float* part_o, const float2* part_ml, float* o_latent,
                                             int num_splits, int64_t items, int rank) {
  const int64_t item = blockIdx.x;
  float m = -INFINITY;
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, part_ml[s * items + item].x);
  const float m_ref = m == -INFINITY ? 0.0f : m;
  float l = 0.0f;
  for (int s = 0; s < num_splits; ++s) {
    const float2 ml = part_ml[s * items + item];
    l += exp2f(ml.x - m_ref) * ml.y;
  }
  const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
  for (int col = threadIdx.x; col < rank; col += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < num_splits; ++s)
      o += exp2f(part_ml[s * items + item].x - m_ref) * part_o[(s * items + item) * rank + col];
    o_latent[item * rank + col] = o * inv_l;
  }
}

}  // namespace

void paged_latent_attention(TensorView out, TensorView q_latent, const AttentionView& view, TensorView kv_b,
                            const AttentionParams& params) {
  const int64_t num_rows = q_latent.shape[0];
  if (num_rows == 0 || view.num_seqs == 0) return;
  const int heads = static_cast<int>(q_latent.shape[1]);
  const int width = view.head_dim, rank = static_cast<int>(kv_b.shape[1]), v_dim = static_cast<int>(out.shape[2]);
  SE_CHECK(width % 8 == 0 && width <= kMaxWidth && rank <= kMaxRank && view.page_bytes % 16 == 0,
           "cuda::paged_latent_attention: latent rows of {} values (a multiple of 8, at most {}) with a latent of {} "
           "(at most {})",
           width, kMaxWidth, rank, kMaxRank);
  CudaContext& context = CudaContext::current();
  const size_t smem = shared_bytes(width);
  // The kernel's dynamic shared memory limit set so far; a thread drives one device.
  thread_local size_t smem_opted_in = 0;
  if (smem > smem_opted_in) {
    SE_CUDA_CHECK(cudaFuncSetAttribute(paged_latent_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    smem_opted_in = smem;
  }

  LatentAttentionArgs args{};
  PagedAttentionArgs& a = args.tile;
  a.q = q_latent.data;
  a.q_dtype = q_latent.dtype;
  a.kv_base = static_cast<const char*>(view.kv_base);
  a.page_bytes = view.page_bytes;
  a.page_size = view.page_size;
  a.num_kv_heads = 1;
  a.group = heads;
  a.num_heads = heads;
  a.num_rows = static_cast<int32_t>(num_rows);
  a.num_seqs = view.num_seqs;
  a.q_indptr = view.q_indptr;
  a.seqs = view.seqs;
  a.select_unit = !view.has_selection ? 0 : (view.selection_unit == SelectionUnit::kPage ? view.page_size : 1);
  a.produced = view.produced;
  a.scale = params.scale;
  a.softcap = params.logit_softcap;
  a.window = params.sliding_window;
  // A tile is one row's heads when they fill a CTA's vectors (q_blocks CTAs of it), else several rows.
  a.rows_per_tile = std::max(1, kVectors / heads);
  a.q_blocks = static_cast<int32_t>(launch::ceil_div(int64_t{a.rows_per_tile} * heads, kVectors));
  a.min_rows = 0;
  a.max_rows = INT32_MAX;
  args.width = width;
  args.rank = rank;
  // Each sequence adds at most one partial tile beyond num_rows / rows_per_tile whole ones.
  const int64_t grid_x = a.rows_per_tile == 1 ? num_rows : num_rows / a.rows_per_tile + view.num_seqs;

  const int64_t items = num_rows * heads;
  const int64_t base_ctas = grid_x * a.q_blocks;
  const int blocks_per_sm =
      std::max<int>(1, static_cast<int>(context.props().sharedMemPerMultiprocessor / (smem + 1024)));
  const int64_t slots = int64_t{blocks_per_sm} * context.props().multiProcessorCount;
  const int64_t bytes_per_split = items * (int64_t{rank} * 4 + 8);
  a.num_splits = base_ctas >= slots ? 1
                                    : static_cast<int32_t>(std::clamp<int64_t>(
                                          std::min(launch::ceil_div(slots, base_ctas),
                                                   kPartialBudgetBytes / std::max<int64_t>(bytes_per_split, 1)),
                                          1, kMaxSplits));
  const size_t latent_bytes = static_cast<size_t>(items) * rank * sizeof(float);
  char* scratch = static_cast<char*>(
      context.scratch(latent_bytes + (a.num_splits > 1 ? static_cast<size_t>(bytes_per_split) * a.num_splits : 0)));
  args.o_latent = reinterpret_cast<float*>(scratch);
  if (a.num_splits > 1) {
    a.part_o = reinterpret_cast<float*>(scratch + latent_bytes);
    a.part_ml = reinterpret_cast<float2*>(scratch + latent_bytes + items * rank * 4 * a.num_splits);
  }

  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(a.q_blocks),
                  static_cast<unsigned>(a.num_splits));
  paged_latent_attention_kernel<<<grid, kThreads, smem, context.stream()>>>(args);
  SE_CUDA_CHECK_LAUNCH("paged_latent_attention_kernel");
  if (a.num_splits > 1) {
    combine_latent_splits_kernel<<<static_cast<unsigned>(items), 256, 0, context.stream()>>>(
        a.part_o, a.part_ml, args.o_latent, a.num_splits, items, rank);
    SE_CUDA_CHECK_LAUNCH("combine_latent_splits_kernel");
  }

  // out[t, h] = W_uv[h] o[t, h]: W_uv[h] is the last v_dim rows of head h's block of kv_b.
  HeadGemm g{};
  g.x = args.o_latent;
  g.x_dtype = DType::kF32;
  g.x_head_stride = rank;
  g.y = out.data;
  g.y_dtype = out.dtype;
  g.y_head_stride = v_dim;
  g.w = kv_b.data;
  g.w_dtype = kv_b.dtype;
  g.w_cols = rank;
  g.w_rows_per_head = kv_b.shape[0] / heads;
  g.w_first_row = g.w_rows_per_head - v_dim;
  g.transposed = true;
  g.rows = static_cast<int32_t>(num_rows);
  g.heads = heads;
  g.k = rank;
  g.n = v_dim;
  head_gemm(g);
}

}  // namespace se::cuda
