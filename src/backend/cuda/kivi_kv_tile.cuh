// The tiled paged-attention kernel's K/V tile loader over a KIVI stream (attention_view.h, kKivi): the same rows go
// to the same swizzled places of the bf16 stage as load_kv_tile's, each 16-byte chunk (8 channels) decoded in
// registers. Token j's key comes from its quantized page when j < num_quantized_keys (channel c's code in its own
// word row, under channel c's fp16 scale and minimum), else from the window's bf16 row; its value likewise against
// num_quantized_values (the token's codes in one word, one value group's scale and minimum). A code reads back as
// the CPU's KiviRows decodes it, fp16(fp16(code * scale) + minimum), then rounded to bf16 for the tensor cores; the
// stage is the only decoded copy of a row there is. Rows past the split are zero.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/paged_attention_args.h"

namespace se::cuda::attention_tile {

// One KV head's stream of a KIVI view, as a CTA reads it.
struct KiviStream {
  const int32_t* quantized_pages = nullptr;  // group order
  const int32_t* window_pages = nullptr;     // the residual window's pages
  int32_t num_quantized_keys = 0, num_quantized_values = 0, first_slot = 0;

  static __device__ __forceinline__ KiviStream of(const PagedAttentionArgs& a, int32_t slice, int32_t kv_head) {
    const SeqKvView& sv = a.seqs[slice];
    const KiviSeqView& kivi = a.kivi.seqs[slice];
    KiviStream st;
    st.quantized_pages = sv.page_ids + static_cast<int64_t>(kv_head) * sv.stride;
    st.window_pages = kivi.residual.page_ids + static_cast<int64_t>(kv_head) * kivi.residual.stride;
    st.num_quantized_keys = kivi.num_quantized_keys[kv_head];
    st.num_quantized_values = kivi.num_quantized_values[kv_head];
    st.first_slot = kivi.residual_first_slot[kv_head];
    return st;
  }
};

// fp16(fp16(code * scale) + minimum), as kivi_dequantize.
__device__ __forceinline__ float kivi_decode(uint32_t code, __half scale, __half minimum) {
  const float scaled = __half2float(__float2half_rn(__fmul_rn(static_cast<float>(code), __half2float(scale))));
  return __half2float(__float2half_rn(__fadd_rn(scaled, __half2float(minimum))));
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&x)[8]) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Channels [c0, c0 + 8) of token j's key (kv = 0) or value (kv = 1).
template <int D>
__device__ __forceinline__ uint4 kivi_chunk(const PagedAttentionArgs& a, const KiviStream& st, int kv, int32_t j,
                                            int c0) {
  const KiviTileArgs& k = a.kivi;
  const int32_t quantized = kv == 0 ? st.num_quantized_keys : st.num_quantized_values;
  if (j >= quantized) {
    const int32_t slot = j - st.num_quantized_values + st.first_slot;
    const int32_t page = st.window_pages[slot / a.page_size];
    const char* row = a.kv_base + static_cast<size_t>(page) * a.page_bytes +
                      ((static_cast<size_t>(kv) * a.page_size + slot % a.page_size) * D + c0) * sizeof(__nv_bfloat16);
    return *reinterpret_cast<const uint4*>(row);
  }
  const char* page = k.quantized_base + static_cast<size_t>(st.quantized_pages[j / k.group_size]) * k.layout.page_bytes;
  const int32_t t = j % k.group_size;
  const int per_word = 32 / k.bits;
  const uint32_t mask = (1u << k.bits) - 1u;
  float x[8];
  if (kv == 0) {
    // Channel c's codes are a row of key_words words; token t is code t of it.
    const auto* words = reinterpret_cast<const uint32_t*>(page + k.layout.key_codes);
    const auto* scale = reinterpret_cast<const __half*>(page + k.layout.key_scale);
    const auto* minimum = reinterpret_cast<const __half*>(page + k.layout.key_min);
    const int shift = (t % per_word) * k.bits;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = c0 + i;
      const uint32_t word = words[static_cast<int64_t>(c) * k.layout.key_words + t / per_word];
      x[i] = kivi_decode((word >> shift) & mask, scale[c], minimum[c]);
    }
  } else {
    // Token t's codes are one row of value_words words; the 8 channels lie in one word and one value group.
    const uint32_t word = reinterpret_cast<const uint32_t*>(
        page + k.layout.value_codes)[static_cast<int64_t>(t) * k.layout.value_words + c0 / per_word];
    const int64_t group = static_cast<int64_t>(t) * k.layout.value_groups + c0 / k.value_group_size;
    const __half scale = reinterpret_cast<const __half*>(page + k.layout.value_scale)[group];
    const __half minimum = reinterpret_cast<const __half*>(page + k.layout.value_min)[group];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = kivi_decode((word >> (((c0 + i) % per_word) * k.bits)) & mask, scale, minimum);
  }
  return pack_bf16x8(x);
}

// Gathers tokens [tile_start, tile_start + kKeys) of the stream into a stage (K rows at k_s, V rows after them), by
// the kThreads threads whose index in that group is `thread`, as load_kv_tile does.
template <int D, int kKeys, int kThreads, bool kBlocks>
__device__ __forceinline__ void load_kivi_kv_tile(__nv_bfloat16* k_s, int tile_start, int split_end,
                                                  const KiviStream& st, const PagedAttentionArgs& a, int thread) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  constexpr int kPasses = kKeys / kRowsPerPass;
  __nv_bfloat16* v_s = k_s + kKeys * D;
  const int chunk = thread % kChunks;
  const int row0 = thread / kChunks;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    const int32_t token = tile_start + row;
    uint4 key = make_uint4(0, 0, 0, 0), value = key;
    if (token < split_end) {
      key = kivi_chunk<D>(a, st, 0, token, chunk * 8);
      value = kivi_chunk<D>(a, st, 1, token, chunk * 8);
    }
    const int d = kBlocks ? swizzled_blocks<kKeys>(row, chunk) : swizzled<D>(row, chunk);
    *reinterpret_cast<uint4*>(k_s + d) = key;
    *reinterpret_cast<uint4*>(v_s + d) = value;
  }
}

}  // namespace se::cuda::attention_tile
