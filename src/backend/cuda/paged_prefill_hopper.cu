// Prefill attention over paged KV at head_dim 128 on Hopper, warp-specialized in the way of
// FlashAttention-3: a CTA of three warpgroups takes 128 query vectors (rows of one sequence x the
// query heads of one KV head) and one split of their visible keys.
// - The producer warpgroup gathers 128-key K and V tiles page by page with cp.async into a
//   three-stage ring; a stage's "full" mbarrier completes when every producer thread's copies have
//   landed, its "empty" mbarrier when both consumers are done reading it.
// - Two consumer warpgroups own 64 query vectors each: S = Q K^T and O += P V as warpgroup MMAs
//   (wgmma) reading K and V from shared memory, the online softmax in registers (log2 domain).
// - The consumers take turns issuing their MMAs (two named barriers pass a token), so one's
//   exponentials run while the other's matrix work keeps the tensor cores busy, and each
//   warpgroup's softmax of a tile overlaps its own P V of the tile before.
// - setmaxnreg gives the consumers the registers (S, O, Q and P fragments) the producer does not use.
// Split-KV, sliding windows, softcap, chunked prefill against a cached prefix and the combine pass
// behave as in the tiled kernel (paged_attention_tiled.cu), which SE_PREFILL_KERNEL=tiled selects
// instead (paged_attention_args.h).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdlib>
#include <string_view>

#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/paged_attention_args.h"

namespace se::cuda {

namespace {
using namespace attention_tile;

constexpr int kD = 128;
constexpr int kKeys = 128;  // keys per K/V tile
constexpr int kConsumers = 2;
constexpr int kQueryVectors = 64 * kConsumers;
constexpr int kWarpgroupThreads = 128;
constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
// Three stages: with the overlap schedule a stage's V is read until the next tile's softmax is done,
// so a third stage keeps a tile loading while two are in use.
constexpr int kStages = 3;
constexpr int kTileElems = kKeys * kD;
constexpr int kScoreTiles = kKeys / 8;  // n8 tiles of S per warp
// 128 x 56 + 256 x 224 registers fit the SM's 64K. The producer's address arithmetic spills below 56.
constexpr int kProducerRegisters = 56;
constexpr int kConsumerRegisters = 224;
// Named barriers 1 and 2 are the consumers' turns at the tensor cores (0 is __syncthreads).
constexpr int kFirstTurnBarrier = 1;

// K/V stages, then Q, then the stages' mbarriers; the warpgroup MMAs' swizzle atoms need 1024-byte
// alignment, which the dynamic shared memory's base is not promised.
constexpr size_t kSmemBytes = 1024 + size_t{kStages} * 2 * kTileElems * sizeof(bf16) +
                               size_t{kQueryVectors} * kD * sizeof(bf16) + 2 * kStages * sizeof(uint64_t);
static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM: the K/V ring, Q and the barriers");

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count));
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred ready;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 ready, [%0], %1;\n"
      "@!ready bra WAIT;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// One arrival on `bar` once this thread's cp.async copies so far have landed (the barrier's count
// includes it: .noinc).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar))
               : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kConsumers * kWarpgroupThreads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kConsumers * kWarpgroupThreads) : "memory");
}

__global__ void __launch_bounds__(kThreads, 1) paged_prefill_hopper_kernel(const PagedAttentionArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + (1024 - smem_address(smem_raw) % 1024) % 1024;
  bf16* kv_s = reinterpret_cast<bf16*>(smem);                          // [kStages][K, V][kKeys][kD]
  bf16* q_s = kv_s + kStages * 2 * kTileElems;                         // [kQueryVectors][kD]
  uint64_t* full = reinterpret_cast<uint64_t*>(q_s + kQueryVectors * kD);  // [kStages]
  uint64_t* empty = full + kStages;                                        // [kStages]

  // Tiles later in a sequence see more keys under the causal mask: the grid runs them first.
  int slice = 0, tile_in_seq = 0;
  if (!find_tile(a, gridDim.x - 1 - blockIdx.x, slice, tile_in_seq)) return;  // the whole CTA

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], kWarpgroupThreads);
      mbarrier_init(&empty[s], kConsumers * 4);  // one arrival per consumer warp
    }
  }
  __syncthreads();

  const QueryTile t(a, slice, tile_in_seq);
  int32_t kv_begin, kv_end, split_begin, split_end;
  t.visible_keys(a, kv_begin, kv_end);
  split_keys<kKeys>(a, kv_begin, kv_end, split_begin, split_end);
  const int num_tiles = (split_end - split_begin + kKeys - 1) / kKeys;

  if (threadIdx.x < kWarpgroupThreads) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    const KeyMap every_token{nullptr, 1};
    for (int it = 0; it < num_tiles; ++it) {
      const int stage = it % kStages;
      if (it >= kStages) mbarrier_wait(&empty[stage], (it / kStages - 1) & 1);
      load_kv_tile<kD, kKeys, kWarpgroupThreads, false, true>(
          kv_s + stage * 2 * kTileElems, nullptr, split_begin + it * kKeys, split_end, t.pages,
          every_token, t.len, a, threadIdx.x);
      cp_async_arrive(&full[stage]);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy outlives its thread
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));

  const int consumer = threadIdx.x / kWarpgroupThreads - 1;
  const int lane = threadIdx.x & 31;
  const int mw = (threadIdx.x - kWarpgroupThreads) >> 5;  // this warp's 16 query vectors
  const int t4 = lane & 3;  // the fragment column pair

  // This warp's 16 query vectors -> shared -> A fragments.
  t.load_queries<kD, kQueryVectors>(a, q_s, mw * 16, 16, lane, 32);
  __syncwarp();
  uint32_t q_frag[kD / 16][4];
  {
    const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks)
      ldmatrix_x4(q_frag[ks], q_s + swizzled<kD>(mw * 16 + ri + 8 * (mi & 1), 2 * ks + (mi >> 1)));
  }

  const RowVisibility vis = row_visibility<kQueryVectors>(a, t, mw * 16, split_end);

  SoftmaxRows<kD> rows;
  float s[kScoreTiles][4];    // scores of the tile in hand, then its probabilities
  uint32_t pa[kKeys / 16][4];  // probabilities as P V's A fragments (two n8 tiles of S = k16)

  auto stage_k = [&](int it) { return kv_s + (it % kStages) * 2 * kTileElems; };
  auto wait_tile = [&](int it) {
    mbarrier_wait(&full[it % kStages], (it / kStages) & 1);
    // cp.async wrote the stage through the generic proxy; the MMAs read it through the async one.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  };
  auto release_tile = [&](int it) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&empty[it % kStages]);
  };
  // S = Q K^T, issued. K-major B: k step ks reads 16 columns of column block ks / 4.
  auto issue_scores = [&](int it) {
    const bf16* k_s = stage_k(it);
#pragma unroll
    for (int nt = 0; nt < kScoreTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
    fence_accumulators(s);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks)
      wgmma_bf16<kKeys, false>(
          s, q_frag[ks], wgmma_descriptor(k_s + (ks >> 2) * (kKeys * 64) + (ks & 3) * 16, 16, 1024));
    wgmma_commit();
  };
  // O += P V, issued. MN-major B: keys 16 kk.. are two whole atoms; the column blocks lie a tile
  // apart.
  auto issue_values = [&](int it) {
    const bf16* v_s = stage_k(it) + kTileElems;
    fence_accumulators(rows.o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_bf16<kD, true>(rows.o, pa[kk], wgmma_descriptor(v_s + kk * 16 * 64, kKeys * 64 * 2, 1024));
    wgmma_commit();
  };
  // Scale, cap and mask tile `it`'s scores and take its online-softmax step: s becomes the
  // probabilities, alpha the rescale of what came before.
  auto softmax = [&](int it, float (&alpha)[2]) {
    const int tile_start = split_begin + it * kKeys;
    const bool masked = tile_start < vis.all_lo || tile_start + kKeys - 1 > vis.all_hi;
    auto visible = [&](int nt, int e) {
      const int rr = e >> 1;
      const int key = tile_start + nt * 8 + 2 * t4 + (e & 1);
      return vis.sees(rr, key) & (key < split_end);
    };
    online_softmax_step(a, s, masked, visible, rows, alpha);
  };
  auto rescale_and_pack = [&](const float (&alpha)[2]) {
    rows.rescale_output(alpha);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) pack_probabilities(s, kk, pa[kk]);
  };

  // The consumers take turns issuing their MMAs; the first one holds the first turn.
  const int my_turn = kFirstTurnBarrier + consumer;
  const int other_turn = kFirstTurnBarrier + 1 - consumer;
  if (consumer == 0) named_barrier_arrive(my_turn);
  float alpha[2];
  if (num_tiles > 0) {
    // A turn covers tile it's Q K^T and tile it - 1's P V: the softmax of tile it overlaps that P V.
    wait_tile(0);
    named_barrier_sync(my_turn);
    issue_scores(0);
    named_barrier_arrive(other_turn);
    wgmma_wait<0>();
    fence_accumulators(s);
    softmax(0, alpha);
    rescale_and_pack(alpha);
    for (int it = 1; it < num_tiles; ++it) {
      wait_tile(it);
      named_barrier_sync(my_turn);
      issue_scores(it);
      issue_values(it - 1);
      named_barrier_arrive(other_turn);
      wgmma_wait<1>();  // the scores; P V may still run
      fence_accumulators(s);
      softmax(it, alpha);
      wgmma_wait<0>();
      fence_accumulators(rows.o);
      fence_fragments(pa);
      release_tile(it - 1);
      rescale_and_pack(alpha);
    }
    named_barrier_sync(my_turn);
    issue_values(num_tiles - 1);
    if (consumer == 0) named_barrier_arrive(other_turn);  // the second consumer's last turn
    wgmma_wait<0>();
    fence_accumulators(rows.o);
    fence_fragments(pa);
    release_tile(num_tiles - 1);
  } else if (consumer == 0) {
    named_barrier_sync(my_turn);
    named_barrier_arrive(other_turn);
  } else {
    named_barrier_sync(my_turn);
  }

  emit_fragment_rows<kD, kQueryVectors>(a, t, mw * 16, rows);
}

}  // namespace

PrefillKernel prefill_kernel() {
  static const PrefillKernel kernel = [] {
    const char* name = std::getenv("SE_PREFILL_KERNEL");
    const std::string_view value = name == nullptr ? "hopper" : name;
    if (value == "tiled") return PrefillKernel::kTiled;
    if (value == "hopper") return PrefillKernel::kHopper;
    SE_CHECK(false, "SE_PREFILL_KERNEL={}: expected hopper or tiled", value);
    return PrefillKernel::kTiled;
  }();
  return kernel;
}

void launch_paged_prefill_hopper(const PagedAttentionArgs& args, int grid_x) {
  launch_attention<paged_prefill_hopper_kernel>(args, grid_x, kThreads, kSmemBytes, "paged_prefill_hopper_kernel");
}

int paged_prefill_hopper_blocks_per_sm() {
  return resident_ctas_per_sm<paged_prefill_hopper_kernel>(kThreads, kSmemBytes, "paged_prefill_hopper_kernel");
}

}  // namespace se::cuda
