// One block's choice of the k largest of n scores, as top_k_ascending (base/top_k.h) makes it on the host: the
// indices in ascending order, ties going to the lower index. A most-significant-digit radix select over the
// scores' order keys (four 8-bit passes of a shared histogram) finds the k-th largest key; one block scan then
// places every index above it and the lowest-numbered of those equal to it. The key-bound page ranking and the
// filter layers' token filter share it.
#pragma once

#include <cub/cub.cuh>

#include <cstdint>

namespace se::cuda {

// A float's bits as an unsigned key that orders like the float (larger float, larger key); -0 becomes +0 first,
// so the two zeros tie as they compare.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f + 0.0f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

template <int kThreads>
struct BlockTopKStorage {
  typename cub::BlockScan<long long, kThreads>::TempStorage scan;
  int histogram[256];
  uint32_t threshold;
  int remaining;
};

// Writes the indices of the k largest of key_of(0), ..., key_of(n - 1) (0 < k <= n) to out[0, k), ascending.
// Every thread of the kThreads-thread block calls it. Each pass loads kBatch keys per thread at once, so it waits
// out one memory latency per kBatch * kThreads keys.
template <int kThreads, int kBatch, class KeyOf>
__device__ void block_top_k_ascending(BlockTopKStorage<kThreads>& st, int32_t* out, int n, int k, KeyOf key_of) {
  uint32_t prefix = 0;
  uint32_t mask = 0;
  int remaining = k;  // keys still to take at or below the prefix found so far
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kThreads) st.histogram[d] = 0;
    __syncthreads();
    // Scores of one row share their top bits, so most keys hit a few digits: lanes with the same digit add their
    // count through one atomic (the trip count is uniform, so every lane takes part in the match).
    for (int first = 0; first < n; first += kThreads * kBatch) {
      uint32_t keys[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = first + b * kThreads + static_cast<int>(threadIdx.x);
        keys[b] = i < n ? key_of(i) : 0u;
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int i = first + b * kThreads + static_cast<int>(threadIdx.x);
        const uint32_t digit = i < n && (keys[b] & mask) == prefix ? (keys[b] >> shift) & 0xFFu : 256u;
        const unsigned peers = __match_any_sync(0xFFFFFFFFu, digit);
        if (digit < 256u && (threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&st.histogram[digit], __popc(peers));
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // The digit where the count from the top reaches `remaining`: lane l sums digits 255 - 8l down to 248 - 8l,
      // a warp scan gives each lane the keys above its digits, and the one lane whose digits cross walks them.
      const int lane = threadIdx.x;
      int counts[8];
      int sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += counts[i] = st.histogram[255 - 8 * lane - i];
      int through = sum;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int v = __shfl_up_sync(0xFFFFFFFFu, through, offset);
        if (lane >= offset) through += v;
      }
      int above = through - sum;
      if (above < remaining && through >= remaining) {
        for (int i = 0; i < 8; ++i) {
          if (above + counts[i] >= remaining) {
            st.threshold = prefix | (static_cast<uint32_t>(255 - 8 * lane - i) << shift);
            st.remaining = remaining - above;
            break;
          }
          above += counts[i];
        }
      }
    }
    __syncthreads();
    prefix = st.threshold;
    remaining = st.remaining;
    mask |= 0xFFu << shift;
  }
  // Thread t owns the indices [t * span, (t + 1) * span): one scan of its counts of keys above the threshold and
  // equal to it places its indices, the equals going to the lowest-numbered first.
  const int span = (n + kThreads - 1) / kThreads;
  const int begin = min(static_cast<int>(threadIdx.x) * span, n);
  const int end = min(begin + span, n);
  int above = 0, equal = 0;
#pragma unroll 8
  for (int i = begin; i < end; ++i) {
    const uint32_t key = key_of(i);
    above += key > prefix;
    equal += key == prefix;
  }
  long long packed = (static_cast<long long>(above) << 32) | equal;  // both scanned at once
  cub::BlockScan<long long, kThreads>(st.scan).ExclusiveSum(packed, packed);
  int equal_before = static_cast<int>(packed & 0xFFFFFFFF);
  int position = static_cast<int>(packed >> 32) + min(equal_before, remaining);  // this span's first slot
  for (int i = begin; i < end; ++i) {
    const uint32_t key = key_of(i);
    if (key > prefix || (key == prefix && equal_before < remaining)) out[position++] = i;
    equal_before += key == prefix;
  }
}

}  // namespace se::cuda
