// The pieces shared by the paged-attention kernels (the tiled flash-decoding kernel and the warp-specialized
// Hopper prefill kernel): async copies, tensor-core fragments and warpgroup MMAs, the swizzled shared-memory tile
// layouts, a CTA's query tile (its rows, keys, splits and Q staging), the rows' visible keys, the online softmax
// step, the paged K/V tile gather (bf16 or FP8 pages), the result writes, and the kernels' launch and occupancy on
// the host.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/fp8_e4m3.cuh"
#include "backend/cuda/paged_attention_args.h"

namespace se::cuda::attention_tile {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; src_bytes 0 writes zeros (keys past the split).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// d += a (16x16, row-major) * b (16x8, column-major); bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair; `lo` (the lower column) in the low half, as the mma fragments expect.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Hopper warpgroup MMA (sm_90a): d (64 x N, fp32) += a (64 x 16, bf16, this warp's 16 rows in
// registers, laid out as mma.sync's A fragment) * b (16 x N, bf16, shared memory through a
// descriptor). The accumulator holds, per warp, the same fragments as N / 8 mma.sync n8 tiles.
// kTransB = false reads b K-major (rows of 16 contiguous k), true reads it MN-major.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed MMA groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads or writes of the accumulators across an async MMA.
template <int kTiles>
__device__ __forceinline__ void fence_accumulators(float (&d)[kTiles][4]) {
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
    asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
}

// The same for an MMA's register A fragments: the MMA reads them until its wait, which the compiler
// cannot see, so they must stay live (and unmoved) up to the wait.
template <int kFrags>
__device__ __forceinline__ void fence_fragments(uint32_t (&f)[kFrags][4]) {
#pragma unroll
  for (int i = 0; i < kFrags; ++i)
    asm volatile("" : "+r"(f[i][0]), "+r"(f[i][1]), "+r"(f[i][2]), "+r"(f[i][3])::"memory");
}

// Shared-memory matrix descriptor of a 128-byte-swizzled operand (rows of 64 bf16, 8-row atoms of
// 1024 bytes): `leading` bytes between 64-column blocks (MN-major only), `stride` between atoms.
__device__ __forceinline__ uint64_t wgmma_descriptor(const void* p, uint32_t leading,
                                                     uint32_t stride) {
  return static_cast<uint64_t>((smem_address(p) & 0x3FFFF) >> 4) |
         static_cast<uint64_t>(leading >> 4) << 16 | static_cast<uint64_t>(stride >> 4) << 32 |
         uint64_t{1} << 62;
}

template <int N, bool kTransB>
__device__ __forceinline__ void wgmma_bf16(float (&d)[N / 8][4], const uint32_t (&a)[4],
                                           uint64_t b_desc) {
  static_assert(N == 64 || N == 128);
  if constexpr (N == 64) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, "
        "%36, 1, 1, 1, %37;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(kTransB ? 1 : 0));
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, "
        "%68, 1, 1, 1, %69;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(kTransB ? 1 : 0));
  }
}

// Probabilities of two adjacent n8 score tiles (kk's 16 keys) as one P V A fragment (k = 16).
template <int kTiles>
__device__ __forceinline__ void pack_probabilities(const float (&p)[kTiles][4], int kk, uint32_t (&a)[4]) {
  a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
  a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
  a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
  a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled [rows][D] bf16 tile.
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// The same swizzle in the warpgroup-MMA layout of a [kRows][D] tile: D / 64 column blocks of
// [kRows][64], each row 128 bytes, so every 8 rows form one 1024-byte atom of the 128-byte swizzle.
template <int kRows>
__device__ __forceinline__ int swizzled_blocks(int row, int chunk) {
  return (chunk >> 3) * (kRows * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

// The keys one (sequence, KV head) shows a CTA, in ascending token order: without a selection,
// logical key j is token j of the stream; with one, it is token j % unit of selected entry
// j / unit.
struct KeyMap {
  const int32_t* selected;  // this KV head's ascending list, or null = every token
  int32_t unit;             // tokens per entry: 1 (token selection) or page_size (page selection)

  __device__ __forceinline__ int32_t token(int32_t j) const {
    if (selected == nullptr) return j;
    if (unit == 1) return selected[j];
    const int32_t entry = j / unit;
    return selected[entry] * unit + (j - entry * unit);
  }
};

// Finds which (sequence, tile within it) grid column `tile` is: the launch's sequences, in order,
// each contribute ceil(n / rows_per_tile) tiles. Every warp runs it (same answer, no barrier
// needed).
__device__ inline bool find_tile(const PagedAttentionArgs& a, int tile, int& slice, int& tile_in_seq) {
  const int lane = threadIdx.x & 31;
  int base = 0;
  for (int s0 = 0; s0 < a.num_seqs; s0 += 32) {
    const int s = s0 + lane;
    int count = 0;
    if (s < a.num_seqs) {
      const int n = a.q_indptr[s + 1] - a.q_indptr[s];
      if (n > a.min_rows && n <= a.max_rows) count = (n + a.rows_per_tile - 1) / a.rows_per_tile;
    }
    int inclusive = count;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int v = __shfl_up_sync(kFullMask, inclusive, offset);
      if (lane >= offset) inclusive += v;
    }
    const int exclusive = inclusive - count;
    const unsigned owner =
        __ballot_sync(kFullMask, tile >= base + exclusive && tile < base + inclusive);
    if (owner != 0) {
      const int src = __ffs(owner) - 1;
      slice = __shfl_sync(kFullMask, s, src);
      tile_in_seq = tile - base - __shfl_sync(kFullMask, exclusive, src);
      return true;
    }
    base += __shfl_sync(kFullMask, inclusive, 31);
  }
  return false;
}

// One CTA's query tile: rows [r_begin, r_begin + rows) of sequence `slice` (whose n rows start at batch row
// row0) x the query heads of one KV head (blockIdx.y / q_blocks), cut into blocks of query vectors
// (blockIdx.y % q_blocks), and that KV head's stream.
struct QueryTile {
  int32_t slice, kv_head, q_block;
  int32_t row0, n, r_begin, rows;
  int32_t len;           // tokens in the stream
  const int32_t* pages;  // the stream's page ids

  __device__ __forceinline__ QueryTile(const PagedAttentionArgs& a, int32_t slice_, int32_t tile_in_seq)
      : slice(slice_),
        kv_head(static_cast<int32_t>(blockIdx.y) / a.q_blocks),
        q_block(static_cast<int32_t>(blockIdx.y) % a.q_blocks),
        row0(a.q_indptr[slice_]),
        n(a.q_indptr[slice_ + 1] - row0),
        r_begin(tile_in_seq * a.rows_per_tile),
        rows(min(a.rows_per_tile, n - r_begin)),
        len(a.seqs[slice_].num_tokens[kv_head]),
        pages(a.seqs[slice_].page_ids + static_cast<int64_t>(kv_head) * a.seqs[slice_].stride) {}

  // Query vector qv of the CTA's kQueryVectors -> batch row and query head; false for padding.
  template <int kQueryVectors>
  __device__ __forceinline__ bool query_vector(const PagedAttentionArgs& a, int qv, int& row, int& head) const {
    const int gq = q_block * kQueryVectors + qv;
    const int r_local = gq / a.group;
    row = row0 + r_begin + r_local;
    head = kv_head * a.group + (gq - r_local * a.group);
    return r_local < rows;
  }

  // The keys the tile can see: up to its last row's position; with a window, from its first row's window start.
  __device__ __forceinline__ void visible_keys(const PagedAttentionArgs& a, int32_t& begin, int32_t& end) const {
    const int32_t first_row_last = len - n + r_begin;
    end = max(first_row_last + rows, 0);
    begin = min(a.window > 0 ? max(0, first_row_last - a.window + 1) : 0, end);
  }

  // Query vectors [first, first + count) -> shared memory (bf16, swizzled; padding zero), by `threads` threads
  // of which this is `thread`.
  template <int D, int kQueryVectors>
  __device__ __forceinline__ void load_queries(const PagedAttentionArgs& a, bf16* q_s, int first, int count,
                                               int thread, int threads) const {
    constexpr int kChunks = D / 8;
    for (int idx = thread; idx < count * kChunks; idx += threads) {
      const int qv = first + idx / kChunks;
      const int c = idx % kChunks;
      int row, head;
      uint4 packed = make_uint4(0, 0, 0, 0);
      if (query_vector<kQueryVectors>(a, qv, row, head)) {
        const int64_t off = (static_cast<int64_t>(row) * a.num_heads + head) * D + c * 8;
        if (a.q_dtype == DType::kBF16) {
          packed = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(a.q) + off);
        } else {
          const float4 lo = *reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + off);
          const float4 hi = *reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + off + 4);
          packed = make_uint4(pack_bf16(lo.x, lo.y), pack_bf16(lo.z, lo.w), pack_bf16(hi.x, hi.y),
                              pack_bf16(hi.z, hi.w));
        }
      }
      *reinterpret_cast<uint4*>(q_s + swizzled<D>(qv, c)) = packed;
    }
  }
};

// This split's (blockIdx.z's) share of the logical keys [begin, end): whole tiles of kTileKeys.
template <int kTileKeys>
__device__ __forceinline__ void split_keys(const PagedAttentionArgs& a, int32_t begin, int32_t end,
                                           int32_t& split_begin, int32_t& split_end) {
  split_begin = begin;
  split_end = end;
  if (a.num_splits > 1) {
    int32_t chunk = (end - begin + a.num_splits - 1) / a.num_splits;
    chunk = max(kTileKeys, (chunk + kTileKeys - 1) / kTileKeys * kTileKeys);
    split_begin = min(end, begin + static_cast<int32_t>(blockIdx.z) * chunk);
    split_end = min(end, split_begin + chunk);
  }
}

// The key positions one warp's MMA fragment rows see (g and g + 8 of its 16 query vectors, from `first_qv`):
// lo/hi per row (empty for padding), and all_lo/all_hi the range every row of the warp sees within the split,
// inside which a key tile needs no mask.
struct RowVisibility {
  int32_t lo[2], hi[2];
  int32_t all_lo, all_hi;

  // Whether fragment row rr sees the key at stream position `pos` (branch-free: it runs per score).
  __device__ __forceinline__ bool sees(int rr, int32_t pos) const { return (pos >= lo[rr]) & (pos <= hi[rr]); }
};

template <int kQueryVectors>
__device__ __forceinline__ RowVisibility row_visibility(const PagedAttentionArgs& a, const QueryTile& t,
                                                        int first_qv, int32_t split_end) {
  const int g = (threadIdx.x & 31) >> 2;
  RowVisibility v;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    int row, head;
    v.lo[rr] = 1;
    v.hi[rr] = 0;
    if (t.query_vector<kQueryVectors>(a, first_qv + g + 8 * rr, row, head)) {
      v.hi[rr] = t.len - t.n + (row - t.row0);
      v.lo[rr] = a.window > 0 ? max(0, v.hi[rr] - a.window + 1) : 0;
    }
  }
  v.all_lo = max(v.lo[0], v.lo[1]);
  v.all_hi = min(v.hi[0], v.hi[1]);
#pragma unroll
  for (int offset = 4; offset < 32; offset <<= 1) {
    v.all_lo = max(v.all_lo, __shfl_xor_sync(kFullMask, v.all_lo, offset));
    v.all_hi = min(v.all_hi, __shfl_xor_sync(kFullMask, v.all_hi, offset));
  }
  v.all_hi = min(v.all_hi, split_end - 1);
  return v;
}

// 2^x in one special-function op. exp2f adds a fix-up for results below FLT_MIN, which probabilities
// that small do not need: they flush to 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A warp's online-softmax state for its 16 query vectors, per fragment row (g and g + 8): the running max in
// log2 units, this thread's share of the denominator, and the output accumulators (D / 8 n8 tiles).
template <int D>
struct SoftmaxRows {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  float o[D / 8][4] = {};

  // Scales what the output has accumulated by a softmax step's alpha.
  __device__ __forceinline__ void rescale_output(const float (&alpha)[2]) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
    }
  }
};

// One tile of the online softmax over a warp's score fragments (rows g and g + 8; the 4 lanes of a quad share a
// row). The raw scores are soft-capped when the launch has a cap, and the keys `visible(nt, e)` rejects are
// masked when `masked`: each is one branch per tile around a whole unrolled pass, so the common tile (no cap, no
// mask) runs four instructions per score: max, scale-and-shift (one FMA), exponential, sum. Then s holds the
// probabilities, rows' max and denominator have moved, and alpha is the factor the output is to be rescaled with
// (rows.rescale_output) before this tile's P V. A row that has seen no key keeps the shift 0, so its
// probabilities stay 0 rather than NaN.
template <int kTiles, int D, typename Visible>
__device__ __forceinline__ void online_softmax_step(const PagedAttentionArgs& a, float (&s)[kTiles][4], bool masked,
                                                    Visible&& visible, SoftmaxRows<D>& rows, float (&alpha)[2]) {
  float factor = a.scale * kLog2e;  // raw score -> log2 units
  if (a.softcap > 0.0f) {
    const float to_capped = a.scale / a.softcap;
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = a.softcap * tanhf(s[nt][e] * to_capped);
    factor = kLog2e;
  }
  if (masked) {
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = visible(nt, e) ? s[nt][e] : -INFINITY;
  }
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[nt][e]);
  float shift[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    tile_max[rr] = fmaxf(tile_max[rr], __shfl_xor_sync(kFullMask, tile_max[rr], 1));
    tile_max[rr] = fmaxf(tile_max[rr], __shfl_xor_sync(kFullMask, tile_max[rr], 2));
    const float m_new = fmaxf(rows.m[rr], tile_max[rr] * factor);  // factor > 0: the max commutes
    shift[rr] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[rr] = fast_exp2(rows.m[rr] - shift[rr]);
    rows.m[rr] = m_new;
    rows.l[rr] *= alpha[rr];
  }
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = fast_exp2(fmaf(s[nt][e], factor, -shift[e >> 1]));
      s[nt][e] = p;
      rows.l[e >> 1] += p;
    }
}

// Gathers keys [tile_start, tile_start + kKeys) of one KV head into a stage: K rows at k_s, V rows
// after them, by the kThreads threads whose index in that group is `thread` (16-byte chunk
// thread % (D / 8) of rows thread / (D / 8) + pass * kRowsPerPass). The selection variant maps
// logical keys to tokens through `map` and records each row's token in tok_s (-1 past the split or
// the stream, whose rows are zero-filled).
template <int D, int kKeys, int kThreads, bool kSel, bool kBlocks>
__device__ __forceinline__ void load_kv_tile(bf16* k_s, int32_t* tok_s, int tile_start,
                                             int split_end, const int32_t* pages,
                                             const KeyMap& map, int32_t len,
                                             const PagedAttentionArgs& a, int thread) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  constexpr int kPasses = kKeys / kRowsPerPass;
  bf16* v_s = k_s + kKeys * D;
  const int chunk = thread % kChunks;
  const int row0 = thread / kChunks;
  const int page_shift = (a.page_size & (a.page_size - 1)) == 0 ? __ffs(a.page_size) - 1 : -1;
  auto dst = [&](int row) { return kBlocks ? swizzled_blocks<kKeys>(row, chunk) : swizzled<D>(row, chunk); };
  const size_t v_offset = static_cast<size_t>(a.page_size) * D * sizeof(bf16);

  if (!kSel && page_shift >= 0 && tile_start + kKeys <= split_end) {
    // A whole dense tile (every tile but a split's last): no bounds, no zero fill, and the swizzle of
    // row0 + pass * kRowsPerPass is row0's moved by whole rows when kRowsPerPass keeps row & 7. This is
    // the prefill producer's inner loop, a dozen instructions per row.
    const uint32_t offset_mask = a.page_size - 1;
    const char* chunk_base = a.kv_base + chunk * 16;
    const int dst0 = dst(row0);
#pragma unroll 4
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = row0 + pass * kRowsPerPass;
      const int32_t token = tile_start + row;
      const uint32_t page = static_cast<uint32_t>(pages[token >> page_shift]);
      const char* k_src = chunk_base + static_cast<size_t>(page) * a.page_bytes +
                          ((static_cast<uint32_t>(token) & offset_mask) * (D * sizeof(bf16)));
      const int d = kRowsPerPass % 8 == 0 ? dst0 + pass * kRowsPerPass * (kBlocks ? 64 : D) : dst(row);
      cp_async_16(k_s + d, k_src, 16);
      cp_async_16(v_s + d, k_src + v_offset, 16);
    }
    return;
  }
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    int token = tile_start + row;
    bool in_split = token < split_end;
    if constexpr (kSel) {
      if (in_split) token = map.token(token);
      in_split = in_split && token >= 0 && token < len;
      if (chunk == 0) tok_s[row] = in_split ? token : -1;
    }
    const char* k_src = a.kv_base;
    if (in_split) {
      // Page sizes are powers of two in practice; a shift spares the division per row.
      const int32_t page_idx = page_shift >= 0 ? token >> page_shift : token / a.page_size;
      const int32_t offset = token - page_idx * a.page_size;
      k_src = a.kv_base + static_cast<size_t>(pages[page_idx]) * a.page_bytes +
              (static_cast<size_t>(offset) * D + chunk * 8) * sizeof(bf16);
    }
    cp_async_16(k_s + dst(row), k_src, in_split ? 16 : 0);
    cp_async_16(v_s + dst(row), in_split ? k_src + v_offset : k_src, in_split ? 16 : 0);
  }
}

// load_kv_tile's twin for FP8 pages (one e4m3 code per element, attention_view.h), in two halves: fetch issues the
// loads of this thread's codes of a tile into registers, store decodes them (code x the KV head's k_scale or v_scale)
// into the same swizzled places of a bf16 stage that load_kv_tile fills. A kernel that fetches the next tile before
// computing the current one and stores it after hides the loads' latency behind that computation, as cp.async does
// for bf16 pages; the stage is the only decoded copy of a K/V row there is (the cache stays in codes). Rows past the
// split are zero. No selection variant.
template <int D, int kKeys, int kThreads>
struct Fp8KvTileCodes {
  static constexpr int kChunks = D / 8;
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kPasses = kKeys / kRowsPerPass;
  uint2 k[kPasses], v[kPasses];  // 8 codes each: one 16-byte chunk of a bf16 row

  __device__ __forceinline__ void fetch(int tile_start, int split_end, const int32_t* pages,
                                        const PagedAttentionArgs& a, int thread) {
    const int chunk = thread % kChunks;
    const int row0 = thread / kChunks;
    const size_t v_offset = static_cast<size_t>(a.page_size) * D;  // one byte per element
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int32_t token = tile_start + row0 + pass * kRowsPerPass;
      k[pass] = v[pass] = make_uint2(0, 0);  // e4m3 0x00 is +0
      if (token < split_end) {
        const int32_t page_idx = token / a.page_size;
        const char* k_src = a.kv_base + static_cast<size_t>(pages[page_idx]) * a.page_bytes +
                            static_cast<size_t>(token - page_idx * a.page_size) * D + chunk * 8;
        k[pass] = *reinterpret_cast<const uint2*>(k_src);
        v[pass] = *reinterpret_cast<const uint2*>(k_src + v_offset);
      }
    }
  }

  template <bool kBlocks>
  __device__ __forceinline__ void store(bf16* k_s, float k_scale, float v_scale, int thread) const {
    bf16* v_s = k_s + kKeys * D;
    const int chunk = thread % kChunks;
    const int row0 = thread / kChunks;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int row = row0 + pass * kRowsPerPass;
      const int d = kBlocks ? swizzled_blocks<kKeys>(row, chunk) : swizzled<D>(row, chunk);
      *reinterpret_cast<uint4*>(k_s + d) = fp8_e4m3x8_to_bf16x8(k[pass], k_scale);
      *reinterpret_cast<uint4*>(v_s + d) = fp8_e4m3x8_to_bf16x8(v[pass], v_scale);
    }
  }
};

// Writes query vector (row, head)'s dims d, d + 1: the final output when the launch has one split,
// else this split's (blockIdx.z's) unnormalized partial, with its (m, l) when write_ml.
template <int D>
__device__ __forceinline__ void emit_result(const PagedAttentionArgs& a, int row, int head, int d,
                                            float o0, float o1, float m, float l, bool write_ml) {
  const int64_t item = static_cast<int64_t>(row) * a.num_heads + head;
  if (a.num_splits == 1) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: zeros, as the CPU reference
    const int64_t off = item * D + d;
    if (a.out_dtype == DType::kBF16) {
      *reinterpret_cast<uint32_t*>(static_cast<bf16*>(a.out) + off) = pack_bf16(o0 * inv, o1 * inv);
    } else {
      *reinterpret_cast<float2*>(static_cast<float*>(a.out) + off) = make_float2(o0 * inv, o1 * inv);
    }
  } else {
    const int64_t part = static_cast<int64_t>(blockIdx.z) * a.num_rows * a.num_heads + item;
    *reinterpret_cast<float2*>(a.part_o + part * D + d) = make_float2(o0, o1);
    if (write_ml) a.part_ml[part] = make_float2(m, l);
  }
}

// Each fragment row's denominator, summed over the four lanes of its quad.
template <int D>
__device__ __forceinline__ void sum_denominators_over_quads(SoftmaxRows<D>& rows) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    rows.l[rr] += __shfl_xor_sync(kFullMask, rows.l[rr], 1);
    rows.l[rr] += __shfl_xor_sync(kFullMask, rows.l[rr], 2);
  }
}

// Sums each fragment row's denominator over its quad, then writes the warp's 16 query vectors (from first_qv):
// rows g and g + 8, dims 2 t4, 2 t4 + 1 of every n8 tile of O.
template <int D, int kQueryVectors>
__device__ __forceinline__ void emit_fragment_rows(const PagedAttentionArgs& a, const QueryTile& t, int first_qv,
                                                   SoftmaxRows<D>& rows) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  sum_denominators_over_quads(rows);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    int row, head;
    if (!t.query_vector<kQueryVectors>(a, first_qv + g + 8 * rr, row, head)) continue;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      emit_result<D>(a, row, head, dt * 8 + 2 * t4, rows.o[dt][2 * rr], rows.o[dt][2 * rr + 1], rows.m[rr],
                     rows.l[rr], dt == 0 && t4 == 0);
  }
}

// Host side: a kernel's launch over the grid (tiles, KV heads x q_blocks, splits) with `bytes` of dynamic shared
// memory, whose limit is raised once per kernel before its first launch; `name` names the kernel in errors.
template <auto kKernel>
void raise_shared_memory_limit(size_t bytes, const char* name) {
  static const bool raised = [bytes, name] {
    const cudaError_t err =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    SE_CHECK(err == cudaSuccess, "{}: raising the dynamic shared memory limit to {} bytes failed: {}", name, bytes,
             cudaGetErrorString(err));
    return true;
  }();
  (void)raised;
}

template <auto kKernel>
void launch_attention(const PagedAttentionArgs& args, int grid_x, int threads, size_t bytes, const char* name) {
  raise_shared_memory_limit<kKernel>(bytes, name);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(args.num_kv_heads * args.q_blocks),
                  static_cast<unsigned>(args.num_splits));
  kKernel<<<grid, threads, bytes, CudaContext::current().stream()>>>(args);
  SE_CUDA_CHECK_LAUNCH(name);
}

// Resident CTAs per SM of the kernel at that size (for split planning), measured once.
template <auto kKernel>
int resident_ctas_per_sm(int threads, size_t bytes, const char* name) {
  static const int ctas = [threads, bytes, name] {
    raise_shared_memory_limit<kKernel>(bytes, name);
    int n = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, threads, bytes);
    SE_CHECK(err == cudaSuccess, "{}: occupancy query failed: {}", name, cudaGetErrorString(err));
    return n;
  }();
  return ctas;
}

}  // namespace se::cuda::attention_tile
