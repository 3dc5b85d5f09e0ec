// The tiled paged-attention kernel (flash-decoding style, bf16 tensor cores, fp32 accumulation). A
// CTA of 4 or 8 warps takes one tile of query vectors (rows of one sequence x the query heads of
// one KV head) and one split of that tile's visible keys. Keys stream through shared memory 64 at a
// time with cp.async (one 16-byte chunk per K or V row piece, gathered page by page), two stages
// deep. Each warp computes S = Q K^T for its 16 query vectors, an online softmax in registers (log2
// domain) and O += P V with P reused from the score registers.
// - Decode shape (MW = 1): 16 query vectors; the 4 warps split every key tile (mma.sync m16n8k16)
//   and merge at the end.
// - Prefill shape (MW = 8): 128 query vectors, one 16-row block per warp over the whole key tile;
//   at head_dim 128 both products run as Hopper warpgroup MMAs (wgmma, sm_90a), one per 64 query
//   vectors, reading K and V straight from shared memory. At head_dim 256 the prefill shape has 4
//   warps (registers); there, at head_dim 64 and in the selection variant it runs mma.sync.
// Shared tiles are XOR-swizzled by 16-byte chunk (chunk ^ row % 8): cp.async writes and ldmatrix
// reads are free of bank conflicts, and in [64][64] column blocks this is the 128-byte swizzle the
// warpgroup MMAs read. A view with a selection runs the kernel's selection variant: a CTA walks the
// selected tokens of its stream in order (the "logical" keys), gathering each 64-key tile row by
// row (whole pages for a page selection) and masking by the rows' token positions, which the tile
// keeps beside its K and V rows; the dense variant is unchanged. FP8 pages (the FP8 store's e4m3
// codes) run the FP8 variant of both shapes: the next tile's codes are loaded into registers while
// the current tile is computed and then stored decoded (code x the KV head's scale) into the same
// bf16 stage, so everything after the gather is the bf16 kernel's; KIVI streams run a third variant whose loader
// decodes each row from its group codes or reads it from the window (kivi_kv_tile.cuh). The pieces this kernel
// shares with the warp-specialized prefill
// kernel live in attention_tile.cuh. That kernel takes dense head_dim-128 prefill over bf16 pages
// unless SE_PREFILL_KERNEL=tiled keeps it here (paged_attention_args.h).
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_util.cuh"
#include "backend/cuda/kivi_kv_tile.cuh"
#include "backend/cuda/paged_attention_args.h"

namespace se::cuda {

namespace {
using namespace attention_tile;

constexpr int kTileKeys = 64;

// The first logical key in [0, n) whose token is >= x (n when there is none). The whole warp
// searches 32 ways at a time (about log32(n) + 1 rounds of one load per lane) and every lane gets
// the answer.
__device__ int32_t warp_lower_bound(const KeyMap& map, int32_t n, int32_t x) {
  const int lane = threadIdx.x & 31;
  if (n == 0 || map.token(n - 1) < x) return n;  // the common decode case: every entry is visible
  int32_t lo = 0, hi = n - 1;                      // the answer lies in [lo, hi]
  while (lo < hi) {
    const int32_t step = (hi - lo + 31) / 32;
    const int32_t probe = lo + lane * step;
    // The probes below x are a prefix of the lanes (tokens ascend with j).
    const int below = __popc(__ballot_sync(kFullMask, probe < hi && map.token(probe) < x));
    if (below == 0) break;  // token(lo) >= x
    const int32_t next_lo = lo + (below - 1) * step + 1;
    hi = min(hi, lo + below * step);
    lo = next_lo;
  }
  return lo;
}

template <int D, int MW, bool kSel>
struct TiledConfig {
  // Warps that share query rows and split each key tile (the decode shape's 16 rows: 4 of them).
  static constexpr int kKeyGroups = MW >= 4 ? 1 : 4 / MW;
  static constexpr int kWarps = MW * kKeyGroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kQueryVectors = 16 * MW;  // per CTA
  // The 8-warp prefill shape at head_dim 128 computes both products with warpgroup MMAs (two
  // warpgroups of 64 query vectors); its K/V tiles use the swizzled_blocks layout those read. Head
  // dim 64 and the selection variant keep mma.sync: with warpgroup MMAs two head_dim-64 selection
  // parity cases failed, for a reason not yet found (docs/perf-notes.md).
  static constexpr bool kWgmma = MW == 8 && !kSel && D == 128;
  static constexpr int kKeysPerWarp = kTileKeys / kKeyGroups;
  static constexpr int kScoreTiles = kKeysPerWarp / 8;  // n8 tiles of S per warp
  static constexpr int kTileElems = kTileKeys * D;
  static constexpr bool kQInRegisters = D <= 128;
  // Two stages: a third (tried for decode, docs/perf-notes.md) needs 100 KB of shared memory, fits
  // 2 CTAs per SM instead of 3 and streamed 20% slower.
  static constexpr int kStages = 2;
  // The decode shape at head_dim <= 128 fits three CTAs per SM in shared memory; holding its registers to three
  // CTAs' worth keeps the FP8 variant, whose next tile's codes stay in registers, at the bf16 variant's occupancy.
  static constexpr int kMinBlocks = MW == 1 && D <= 128 ? 3 : 1;
  // The selection variant adds each stage's token positions ([kStages][64] int32) after the K/V
  // stages.
  static constexpr size_t kTokenBytes = kSel ? kStages * kTileKeys * sizeof(int32_t) : 0;
  // The warpgroup MMAs' swizzle atoms must start on 1024-byte boundaries, and the dynamic shared
  // memory's base is only promised a smaller alignment: the kernel aligns it within this slack.
  static constexpr size_t kAlignSlack = kWgmma ? 1024 : 0;
  static constexpr size_t kSmemBytes =
      (static_cast<size_t>(kQueryVectors) * D + kStages * 2 * static_cast<size_t>(kTileElems)) *
          sizeof(bf16) +
      kTokenBytes + kAlignSlack;
  // The decode shape's end-of-CTA merge reuses the K/V stages.
  static_assert(MW != 1 ||
                (kKeyGroups * 16 * D * 4 + kKeyGroups * 16 * 8) <= kStages * 2 * kTileElems * 2);
};

template <int D, int MW, bool kSel, KvPageCodes kCodes>
__global__ void __launch_bounds__(TiledConfig<D, MW, kSel>::kThreads, TiledConfig<D, MW, kSel>::kMinBlocks)
    paged_attention_tiled_kernel(const PagedAttentionArgs a) {
  static_assert(!kSel || kCodes == KvPageCodes::kBf16, "a selection reads bf16 pages only");
  using Cfg = TiledConfig<D, MW, kSel>;
  constexpr int kThreads = Cfg::kThreads;
  constexpr int kM = Cfg::kQueryVectors;
  constexpr int kKG = Cfg::kKeyGroups;
  constexpr int kKPW = Cfg::kKeysPerWarp;
  constexpr int kNT = Cfg::kScoreTiles;
  constexpr int kDT = D / 8;  // n8 tiles of O per warp

  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Q and every K/V stage are whole KB, so an aligned base puts each stage on a 1024-byte boundary.
  unsigned char* smem = smem_raw;
  if constexpr (Cfg::kWgmma) smem += (1024 - smem_address(smem_raw) % 1024) % 1024;
  bf16* q_s = reinterpret_cast<bf16*>(smem);  // [kM][D]
  bf16* kv_s = q_s + kM * D;                      // [kStages][K, V][64][D]
  // [kStages][64] token of each K/V row (selection variant only)
  int32_t* tok_s = reinterpret_cast<int32_t*>(kv_s + Cfg::kStages * 2 * Cfg::kTileElems);

  // Prefill tiles later in a sequence see more keys under the causal mask: the grid runs them
  // first, so the light ones fill the last wave instead of leaving a tail of heavy ones.
  const int grid_tile = MW == 1 ? blockIdx.x : gridDim.x - 1 - blockIdx.x;
  int slice = 0, tile_in_seq = 0;
  if (!find_tile(a, grid_tile, slice, tile_in_seq)) return;  // past the launch's real tiles

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int mw = warp / kKG;  // this warp's 16-row block of query vectors
  const int kg = warp % kKG;  // this warp's share of each key tile
  const QueryTile t(a, slice, tile_in_seq);
  int32_t kv_begin, kv_end;
  t.visible_keys(a, kv_begin, kv_end);
  KeyMap map{nullptr, 1};
  if constexpr (kSel) {
    // [kv_begin, kv_end) becomes the logical keys whose tokens fall in it; splits divide those.
    const SelectedEntries sel = selected_entries(a.produced, a.seqs[slice], slice, t.kv_head, a.num_kv_heads);
    if (sel.entries != nullptr) {
      map.selected = sel.entries;
      map.unit = a.select_unit;
      const int32_t num_keys = sel.count * a.select_unit;
      const int32_t end = warp_lower_bound(map, num_keys, kv_end);
      kv_begin = min(warp_lower_bound(map, num_keys, kv_begin), end);
      kv_end = end;
    }
  }
  int32_t split_begin, split_end;
  split_keys<kTileKeys>(a, kv_begin, kv_end, split_begin, split_end);
  t.load_queries<D, kM>(a, q_s, 0, kM, threadIdx.x, kThreads);

  constexpr bool kFp8 = kCodes == KvPageCodes::kFp8E4M3;
  constexpr bool kKivi = kCodes == KvPageCodes::kKivi;
  const float k_scale = kFp8 ? a.k_scales[t.kv_head] : 1.0f;
  const float v_scale = kFp8 ? a.v_scales[t.kv_head] : 1.0f;
  // FP8 codes in flight: the next tile's, fetched before the current tile is computed and decoded into their stage
  // after it. Loads waited out at the refill streamed FP8 pages at half of bf16's bytes per second (H100, 32K
  // decode). At head_dim 256 a thread's share of a tile (16 chunks of K and V) would spill: there the refill stays
  // synchronous.
  using TileCodes = Fp8KvTileCodes<D, kTileKeys, kThreads>;
  constexpr bool kFp8InFlight = kFp8 && TileCodes::kPasses <= 8;
  TileCodes codes;
  const KiviStream kivi = kKivi ? KiviStream::of(a, slice, t.kv_head) : KiviStream{};
  auto stage_of = [&](int it) { return kv_s + (it % Cfg::kStages) * 2 * Cfg::kTileElems; };
  // Tile `it` of the split into its stage: copied (bf16 pages), fetched and decoded at once (FP8 pages), or decoded
  // from a KIVI stream's groups and window.
  auto load_tile = [&](int it) {
    bf16* stage = stage_of(it);
    if constexpr (kFp8) {
      codes.fetch(split_begin + it * kTileKeys, split_end, t.pages, a, threadIdx.x);
      codes.template store<Cfg::kWgmma>(stage, k_scale, v_scale, threadIdx.x);
    } else if constexpr (kKivi) {
      load_kivi_kv_tile<D, kTileKeys, kThreads, Cfg::kWgmma>(stage, split_begin + it * kTileKeys, split_end, kivi, a,
                                                             threadIdx.x);
    } else {
      load_kv_tile<D, kTileKeys, kThreads, kSel, Cfg::kWgmma>(stage, tok_s + (it % Cfg::kStages) * kTileKeys,
                                                              split_begin + it * kTileKeys, split_end, t.pages, map,
                                                              t.len, a, threadIdx.x);
    }
  };

  constexpr int kStages = Cfg::kStages;
  const int num_tiles = (split_end - split_begin + kTileKeys - 1) / kTileKeys;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_tiles) load_tile(st);
    cp_async_commit();
  }
  __syncthreads();  // Q visible to every warp

  const int mi = lane >> 3;  // ldmatrix: which 8x8 matrix this lane addresses
  const int ri = lane & 7;   // ... and which row of it
  const int g = lane >> 2;   // mma fragments: row within the 8-row half
  const int t4 = lane & 3;   // ... and column pair

  auto load_q_fragment = [&](int ks, uint32_t(&frag)[4]) {
    ldmatrix_x4(frag, q_s + swizzled<D>(mw * 16 + ri + 8 * (mi & 1), 2 * ks + (mi >> 1)));
  };
  uint32_t q_frag[Cfg::kQInRegisters ? D / 16 : 1][4];
  if constexpr (Cfg::kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) load_q_fragment(ks, q_frag[ks]);
  }

  const RowVisibility vis = row_visibility<kM>(a, t, mw * 16, split_end);

  SoftmaxRows<D> rows;

  for (int it = 0; it < num_tiles; ++it) {
    // Refill the stage consumed in the previous iteration (the barrier at its end made that safe).
    const int next = it + kStages - 1;
    if constexpr (kFp8InFlight) {
      if (next < num_tiles) codes.fetch(split_begin + next * kTileKeys, split_end, t.pages, a, threadIdx.x);
    } else if (next < num_tiles) {
      load_tile(next);
    }
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // tile `it` has landed
    // The warpgroup MMAs read shared memory through the async proxy: make the copies visible to it.
    if constexpr (Cfg::kWgmma) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    const bf16* k_s = kv_s + (it % kStages) * 2 * Cfg::kTileElems;
    const bf16* v_s = k_s + Cfg::kTileElems;
    const int tile_start = split_begin + it * kTileKeys;
    const int32_t* tok_stage = tok_s + (it % kStages) * kTileKeys;

    // S = Q K^T over this warp's keys.
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    if constexpr (Cfg::kWgmma) {
      // K-major B: k step ks reads 16 columns of column block ks / 4 (32 bytes into each row).
      fence_accumulators(s);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wgmma_bf16<kTileKeys, false>(
            s, q_frag[ks],
            wgmma_descriptor(k_s + (ks >> 2) * (kTileKeys * 64) + (ks & 3) * 16, 16, 1024));
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(s);
    } else {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t qa[4];
        if constexpr (Cfg::kQInRegisters) {
          for (int i = 0; i < 4; ++i) qa[i] = q_frag[ks][i];
        } else {
          load_q_fragment(ks, qa);
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          const int key = kg * kKPW + np * 16 + ri + 8 * (mi >> 1);
          uint32_t kb[4];
          ldmatrix_x4(kb, k_s + swizzled<D>(key, 2 * ks + (mi & 1)));
          mma_bf16(s[2 * np], qa, kb[0], kb[1]);
          mma_bf16(s[2 * np + 1], qa, kb[2], kb[3]);
        }
      }
    }

    // Scale, cap, mask; online softmax per fragment row (the 4 lanes of a quad share a row).
    const int warp_keys = tile_start + kg * kKPW;
    const bool masked = kSel || warp_keys < vis.all_lo || warp_keys + kKPW - 1 > vis.all_hi;
    auto visible = [&](int nt, int e) {
      const int rr = e >> 1;
      const int local = kg * kKPW + nt * 8 + 2 * t4 + (e & 1);
      if constexpr (kSel) {
        const int32_t token = tok_stage[local];  // -1 past the split: below every vis_lo
        return vis.sees(rr, token);
      } else {
        const int key = tile_start + local;
        return vis.sees(rr, key) & (key < split_end);
      }
    };
    float alpha[2];
    online_softmax_step(a, s, masked, visible, rows, alpha);
    rows.rescale_output(alpha);

    // O += P V: the score accumulators of two adjacent n8 tiles are exactly one A fragment (k = 16
    // keys).
    if constexpr (Cfg::kWgmma) {
      // MN-major B: keys 16 kk.. are two whole atoms; the column blocks lie a K/V block apart.
      uint32_t pa[kKPW / 16][4];
#pragma unroll
      for (int kk = 0; kk < kKPW / 16; ++kk) pack_probabilities(s, kk, pa[kk]);
      fence_accumulators(rows.o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kKPW / 16; ++kk)
        wgmma_bf16<D, true>(rows.o, pa[kk],
                            wgmma_descriptor(v_s + kk * 16 * 64, kTileKeys * 64 * 2, 1024));
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(rows.o);
      fence_fragments(pa);
    } else {
#pragma unroll
      for (int kk = 0; kk < kKPW / 16; ++kk) {
        uint32_t pa[4];
        pack_probabilities(s, kk, pa);
        const int key = kg * kKPW + kk * 16 + ri + 8 * (mi & 1);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_s + swizzled<D>(key, 2 * dp + (mi >> 1)));
          mma_bf16(rows.o[2 * dp], pa, vb[0], vb[1]);
          mma_bf16(rows.o[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
    }
    // The next tile's stage was consumed an iteration ago (behind the barrier above): its codes go in now.
    if constexpr (kFp8InFlight) {
      if (next < num_tiles) codes.template store<Cfg::kWgmma>(stage_of(next), k_scale, v_scale, threadIdx.x);
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();

  if constexpr (kKG == 1) {
    emit_fragment_rows<D, kM>(a, t, mw * 16, rows);
  } else {
    // The key groups saw disjoint keys of the same 16 query vectors: merge their (m, l, O) through
    // shared memory.
    sum_denominators_over_quads(rows);
    __syncthreads();
    float* red_o = reinterpret_cast<float*>(kv_s);                     // [kKG][16][D]
    float2* red_ml = reinterpret_cast<float2*>(red_o + kKG * 16 * D);  // [kKG][16]
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = g + 8 * rr;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt)
        *reinterpret_cast<float2*>(red_o + (kg * 16 + r) * D + dt * 8 + 2 * t4) =
            make_float2(rows.o[dt][2 * rr], rows.o[dt][2 * rr + 1]);
      if (t4 == 0) red_ml[kg * 16 + r] = make_float2(rows.m[rr], rows.l[rr]);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < 16 * D / 2; idx += kThreads) {
      const int r = idx / (D / 2);
      const int d = (idx % (D / 2)) * 2;
      int row, head;
      if (!t.query_vector<kM>(a, r, row, head)) continue;
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < kKG; ++w) m = fmaxf(m, red_ml[w * 16 + r].x);
      const float m_ref = m == -INFINITY ? 0.0f : m;
      float l = 0.0f, o0 = 0.0f, o1 = 0.0f;
#pragma unroll
      for (int w = 0; w < kKG; ++w) {
        const float2 ml = red_ml[w * 16 + r];
        const float weight = exp2f(ml.x - m_ref);
        const float2 o = *reinterpret_cast<const float2*>(red_o + (w * 16 + r) * D + d);
        l += weight * ml.y;
        o0 += weight * o.x;
        o1 += weight * o.y;
      }
      emit_result<D>(a, row, head, d, o0, o1, m, l, d == 0);
    }
  }
}

template <int D, int MW, bool kSel, KvPageCodes kCodes = KvPageCodes::kBf16>
void launch_config(const PagedAttentionArgs& args, int grid_x) {
  using Cfg = TiledConfig<D, MW, kSel>;
  launch_attention<paged_attention_tiled_kernel<D, MW, kSel, kCodes>>(args, grid_x, Cfg::kThreads, Cfg::kSmemBytes,
                                                                      "paged_attention_tiled_kernel");
}

template <int D, int MW, bool kSel, KvPageCodes kCodes = KvPageCodes::kBf16>
int blocks_per_sm() {
  using Cfg = TiledConfig<D, MW, kSel>;
  return resident_ctas_per_sm<paged_attention_tiled_kernel<D, MW, kSel, kCodes>>(Cfg::kThreads, Cfg::kSmemBytes,
                                                                                 "paged_attention_tiled_kernel");
}

// The prefill shape's 16-row blocks per CTA: 8 warps share each K/V tile where the registers
// allow (halving the key traffic per query of a 4-warp CTA), 4 at head_dim 256.
template <int D>
constexpr int kPrefillMW = D <= 128 ? 8 : 4;

// Dense prefill at head_dim 128 over bf16 pages runs the warp-specialized Hopper kernel when chosen.
bool hopper_prefill(int head_dim, bool prefill, bool selection, KvPageCodes codes) {
  return head_dim == 128 && prefill && !selection && codes == KvPageCodes::kBf16 &&
         prefill_kernel() != PrefillKernel::kTiled;
}

template <int D>
void launch_head_dim(const PagedAttentionArgs& args, bool prefill, int grid_x) {
  const bool selection = args.select_unit > 0;
  constexpr int MW = kPrefillMW<D>;
  if (args.codes == KvPageCodes::kFp8E4M3) {
    SE_CHECK(!selection, "cuda::paged_attention: a selection over FP8 pages is not implemented");
    return prefill ? launch_config<D, MW, false, KvPageCodes::kFp8E4M3>(args, grid_x)
                   : launch_config<D, 1, false, KvPageCodes::kFp8E4M3>(args, grid_x);
  }
  if (args.codes == KvPageCodes::kKivi) {
    SE_CHECK(!selection, "cuda::paged_attention: a selection over KIVI pages is not implemented");
    return prefill ? launch_config<D, MW, false, KvPageCodes::kKivi>(args, grid_x)
                   : launch_config<D, 1, false, KvPageCodes::kKivi>(args, grid_x);
  }
  if (hopper_prefill(D, prefill, selection, args.codes)) return launch_paged_prefill_hopper(args, grid_x);
  if (prefill) {
    selection ? launch_config<D, MW, true>(args, grid_x)
              : launch_config<D, MW, false>(args, grid_x);
  } else {
    selection ? launch_config<D, 1, true>(args, grid_x) : launch_config<D, 1, false>(args, grid_x);
  }
}

template <int D>
int blocks_per_sm_head_dim(bool prefill, bool selection, KvPageCodes codes) {
  constexpr int MW = kPrefillMW<D>;
  if (codes == KvPageCodes::kFp8E4M3)
    return prefill ? blocks_per_sm<D, MW, false, KvPageCodes::kFp8E4M3>()
                   : blocks_per_sm<D, 1, false, KvPageCodes::kFp8E4M3>();
  if (codes == KvPageCodes::kKivi)
    return prefill ? blocks_per_sm<D, MW, false, KvPageCodes::kKivi>()
                   : blocks_per_sm<D, 1, false, KvPageCodes::kKivi>();
  if (hopper_prefill(D, prefill, selection, codes)) return paged_prefill_hopper_blocks_per_sm();
  if (prefill) return selection ? blocks_per_sm<D, MW, true>() : blocks_per_sm<D, MW, false>();
  return selection ? blocks_per_sm<D, 1, true>() : blocks_per_sm<D, 1, false>();
}
}  // namespace

int tiled_query_vectors(int head_dim, bool prefill) {
  if (!prefill) return 16;
  return 16 * (head_dim <= 128 ? kPrefillMW<128> : kPrefillMW<256>);
}

void launch_paged_attention_tiled(const PagedAttentionArgs& args, int head_dim, bool prefill,
                                  int grid_x) {
  if (grid_x <= 0) return;
  switch (head_dim) {
    case 64:
      return launch_head_dim<64>(args, prefill, grid_x);
    case 128:
      return launch_head_dim<128>(args, prefill, grid_x);
    case 256:
      return launch_head_dim<256>(args, prefill, grid_x);
    default:
      SE_CHECK(false, "cuda::paged_attention: head_dim {} (tiled kernels exist for 64, 128, 256)",
               head_dim);
  }
}

int tiled_blocks_per_sm(int head_dim, bool prefill, bool selection, KvPageCodes codes) {
  switch (head_dim) {
    case 64:
      return blocks_per_sm_head_dim<64>(prefill, selection, codes);
    case 128:
      return blocks_per_sm_head_dim<128>(prefill, selection, codes);
    default:
      return blocks_per_sm_head_dim<256>(prefill, selection, codes);
  }
}

}  // namespace se::cuda
