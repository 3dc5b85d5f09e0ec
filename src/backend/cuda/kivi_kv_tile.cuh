// The tiled paged-attention kernel's K/V tile loader over a KIVI stream (attention_view.h, kKivi): the same rows go
// to the same swizzled places of the bf16 stage as load_kv_tile's, each 16-byte chunk (8 channels) decoded in
// registers. A quantized key group stores channel by channel: one 32-bit word of channel c holds 32 / bits
// consecutive tokens' codes under channel c's fp16 scale and minimum. The loader walks those words, 8 channels at a
// time, so one thread loads 8 words and 8 scales and minima for 8 x (32 / bits) codes (reading a token's 8 channels
// instead takes 24 loads for 8 codes, of which each word gives `bits` bits), and decodes two channels per half2
// operation (docs/benchmarks.md: 33.0 -> 21.6 ms per 32K batch-4 KIVI-2 step on an H100, bf16 pages 11.8 ms).
// A value's codes are the token's own word row under one value group's scale and minimum, read row by row. Keys at
// j >= num_quantized_keys and values at j >= num_quantized_values come from the window's bf16 rows. A code reads
// back as the CPU's KiviRows decodes it, fp16(fp16(code * scale) + minimum) (kivi_decode2), then rounded to bf16
// for the tensor cores; the stage is the only decoded copy of a row there is. Rows past the split are zero.
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

// fp16(fp16(code * scale) + minimum), as kivi_dequantize, for two codes at once in half2 arithmetic (a code's fp16 is
// 1024 + code's bit pattern less 1024, exact). Each fp16 operation rounds its exact result once, as the reference's
// float product and sum rounded to fp16 do (a float holds two fp16 values' product exactly, and their sum closely
// enough that rounding it again to fp16 gives the same value).
__device__ __forceinline__ __half2 kivi_decode2(uint32_t code0, uint32_t code1, __half2 scale, __half2 minimum) {
  const __half2 magic = __halves2half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400));
  const __half2 codes = __halves2half2(__ushort_as_half(static_cast<unsigned short>(0x6400u | code0)),
                                       __ushort_as_half(static_cast<unsigned short>(0x6400u | code1)));
  return __hadd2(__hmul2(__hsub2(codes, magic), scale), minimum);
}

// Four decoded pairs (8 channels) as 8 bf16 (the stage's rows): fp16 -> f32 -> bf16 rounds once.
__device__ __forceinline__ uint4 pack_bf16x8(const __half2 (&x)[4]) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(x[i]));
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Channels [c0, c0 + 8) of token j's value (kv = 1), or of its key from the window (kv = 0, j >= the stream's
// quantized keys).
template <int D>
__device__ __forceinline__ uint4 kivi_row_chunk(const PagedAttentionArgs& a, const KiviStream& st, int kv, int32_t j,
                                                int c0) {
  const KiviTileArgs& k = a.kivi;
  if (kv == 0 || j >= st.num_quantized_values) {
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
  // The 8 channels lie in one word of the token's row and in one value group.
  const uint32_t word = reinterpret_cast<const uint32_t*>(
      page + k.layout.value_codes)[static_cast<int64_t>(t) * k.layout.value_words + c0 / per_word];
  const int64_t group = static_cast<int64_t>(t) * k.layout.value_groups + c0 / k.value_group_size;
  const __half2 scale = __half2half2(reinterpret_cast<const __half*>(page + k.layout.value_scale)[group]);
  const __half2 minimum = __half2half2(reinterpret_cast<const __half*>(page + k.layout.value_min)[group]);
  const int shift = (c0 % per_word) * k.bits;
  __half2 x[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    x[i] = kivi_decode2((word >> (shift + 2 * i * k.bits)) & mask, (word >> (shift + (2 * i + 1) * k.bits)) & mask,
                        scale, minimum);
  return pack_bf16x8(x);
}

// The quantized keys [j0, j0 + 32 / kBits) of channels [c0, c0 + 8) (j0 a multiple of 32 / kBits, so one word of
// each channel holds them), written to the stage rows of those in [row_begin, row_end) of the tile at tile_start.
template <int D, int kKeys, int kBits, bool kBlocks>
__device__ __forceinline__ void decode_key_words(__nv_bfloat16* k_s, int32_t tile_start, int32_t row_begin,
                                                 int32_t row_end, int32_t j0, int c0, const KiviStream& st,
                                                 const PagedAttentionArgs& a) {
  constexpr int kPerWord = 32 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1u;
  const KiviTileArgs& k = a.kivi;
  const char* page =
      k.quantized_base + static_cast<size_t>(st.quantized_pages[j0 / k.group_size]) * k.layout.page_bytes;
  const auto* words = reinterpret_cast<const uint32_t*>(page + k.layout.key_codes) +
                      static_cast<int64_t>(c0) * k.layout.key_words + (j0 % k.group_size) / kPerWord;
  // Scales and minima are fp16 arrays over channels from 4-byte-aligned offsets (quantized_kv_layout.h).
  const auto* scales = reinterpret_cast<const __half2*>(page + k.layout.key_scale) + c0 / 2;
  const auto* minima = reinterpret_cast<const __half2*>(page + k.layout.key_min) + c0 / 2;
  uint32_t w[8];
  __half2 scale[4], minimum[4];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = words[static_cast<int64_t>(i) * k.layout.key_words];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    scale[i] = scales[i];
    minimum[i] = minima[i];
  }
  const int chunk = c0 / 8;
#pragma unroll
  for (int t = 0; t < kPerWord; ++t) {
    const int32_t row = j0 + t - tile_start;
    if (row < row_begin || row >= row_end) continue;
    __half2 x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      x[i] =
          kivi_decode2((w[2 * i] >> (t * kBits)) & kMask, (w[2 * i + 1] >> (t * kBits)) & kMask, scale[i], minimum[i]);
    const int d = kBlocks ? swizzled_blocks<kKeys>(row, chunk) : swizzled<D>(row, chunk);
    *reinterpret_cast<uint4*>(k_s + d) = pack_bf16x8(x);
  }
}

// Every quantized key row of the tile, [row_begin, row_end), by the kThreads threads: one (8 channels, word) unit
// each at a time.
template <int D, int kKeys, int kThreads, int kBits, bool kBlocks>
__device__ __forceinline__ void load_kivi_key_words(__nv_bfloat16* k_s, int32_t tile_start, int32_t row_end,
                                                    const KiviStream& st, const PagedAttentionArgs& a, int thread) {
  constexpr int kChunks = D / 8;
  constexpr int kPerWord = 32 / kBits;
  const int32_t first_word_token = tile_start / kPerWord * kPerWord;
  const int32_t num_words = (tile_start + row_end - first_word_token + kPerWord - 1) / kPerWord;
  for (int unit = thread; unit < num_words * kChunks; unit += kThreads)
    decode_key_words<D, kKeys, kBits, kBlocks>(
        k_s, tile_start, 0, row_end, first_word_token + (unit / kChunks) * kPerWord, (unit % kChunks) * 8, st, a);
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
  // Rows [0, quantized_rows) of the tile hold quantized keys; the key rows after them come from the window or are 0.
  const int32_t quantized_rows = max(0, min(min(split_end, st.num_quantized_keys) - tile_start, kKeys));
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = row0 + pass * kRowsPerPass;
    const int32_t token = tile_start + row;
    const int d = kBlocks ? swizzled_blocks<kKeys>(row, chunk) : swizzled<D>(row, chunk);
    const bool present = token < split_end;
    *reinterpret_cast<uint4*>(v_s + d) =
        present ? kivi_row_chunk<D>(a, st, 1, token, chunk * 8) : make_uint4(0, 0, 0, 0);
    if (row >= quantized_rows)
      *reinterpret_cast<uint4*>(k_s + d) =
          present ? kivi_row_chunk<D>(a, st, 0, token, chunk * 8) : make_uint4(0, 0, 0, 0);
  }
  if (quantized_rows == 0) return;
  switch (a.kivi.bits) {
    case 2:
      load_kivi_key_words<D, kKeys, kThreads, 2, kBlocks>(k_s, tile_start, quantized_rows, st, a, thread);
      break;
    case 4:
      load_kivi_key_words<D, kKeys, kThreads, 4, kBlocks>(k_s, tile_start, quantized_rows, st, a, thread);
      break;
    default:
      load_kivi_key_words<D, kKeys, kThreads, 8, kBlocks>(k_s, tile_start, quantized_rows, st, a, thread);
  }
}

}  // namespace se::cuda::attention_tile
