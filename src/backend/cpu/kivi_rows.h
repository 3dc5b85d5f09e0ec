// The K and V rows of one stream of a KIVI view (attention_view.h, kKivi) on the CPU: token j's key decodes from its
// quantized page when j < num_quantized_keys (one code per channel, each channel its own group's scale and
// minimum) and is read from the residual pages otherwise; its value alike against num_quantized_values (groups of
// value_group_size channels of the token). A decoded row goes into the caller's `local` buffer (head_dim floats).
// Shared by every CPU op that reads KIVI pages, so they decode alike. With AVX2 and F16C both decode 8 channels at
// a time (kivi_dequantize8): a key's 8 channels gather their words from their own places, keys being packed per
// channel; a value row goes through kivi_dequantize_row.
#pragma once

#include <algorithm>

#include "backend/attention_view.h"
#include "backend/quant/kivi_quant.h"
#include "backend/quant/quantized_kv_layout.h"

namespace se::cpu {

struct KiviRows {
  // Stream (sequence `s`, KV head `h`) of a KIVI view whose pages are laid out as `layout`.
  static KiviRows of(const AttentionView& view, const KiviPageLayout& layout, int32_t s, int32_t h) {
    const SeqKvView& sv = view.seqs[s];
    const KiviSeqView& kivi = view.quantized.kivi_seqs[s];
    return KiviRows{&view,
                    &layout,
                    sv.page_ids + static_cast<int64_t>(h) * sv.stride,
                    kivi.residual.page_ids + static_cast<int64_t>(h) * kivi.residual.stride,
                    kivi.num_quantized_keys[h],
                    kivi.num_quantized_values[h],
                    kivi.residual_first_slot[h]};
  }

  const AttentionView* view;
  const KiviPageLayout* layout;
  const int32_t* pages;           // the stream's quantized page list
  const int32_t* residual_pages;  // its residual page list
  int32_t num_quantized_keys, num_quantized_values, residual_first_slot;

  const char* page(int32_t j) const {
    return static_cast<const char*>(view->quantized.quantized_base) +
           static_cast<size_t>(pages[j / view->quantized.group_size]) * view->quantized.quantized_page_bytes;
  }
  const float* residual_row(int kv, int32_t j) const {
    const int32_t slot = j - num_quantized_values + residual_first_slot;
    return view->element<const float>(residual_pages[slot / view->page_size], kv, slot % view->page_size);
  }

  const float* key(int32_t j, float* local) const {
    if (j >= num_quantized_keys) return residual_row(0, j);
    const QuantizedKvView& qv = view->quantized;
    const char* base = page(j);
    const int32_t t = j % qv.group_size;
    const auto* words = reinterpret_cast<const uint32_t*>(base + layout->key_codes);
    const auto* scale = reinterpret_cast<const uint16_t*>(base + layout->key_scale);
    const auto* mn = reinterpret_cast<const uint16_t*>(base + layout->key_min);
    int32_t c = 0;
#if defined(__AVX2__) && defined(__F16C__)
    // Token t's code sits at the same word and shift in every channel's row.
    const int32_t per_word = 32 / qv.bits;
    const __m128i shift = _mm_cvtsi32_si128((t % per_word) * qv.bits);
    const __m256i mask = _mm256_set1_epi32((1 << qv.bits) - 1);
    const __m256i lane_words = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                  _mm256_set1_epi32(static_cast<int32_t>(layout->key_words)));
    for (; c + 8 <= view->head_dim; c += 8) {
      const auto* first = reinterpret_cast<const int*>(words + int64_t{c} * layout->key_words + t / per_word);
      const __m256i codes =
          _mm256_and_si256(_mm256_srl_epi32(_mm256_i32gather_epi32(first, lane_words, 4), shift), mask);
      const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scale + c)));
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + c)));
      _mm256_storeu_ps(local + c, kivi_dequantize8(codes, s, m));
    }
#endif
    for (; c < view->head_dim; ++c)
      local[c] = kivi_dequantize(kivi_code(words + int64_t{c} * layout->key_words, t, qv.bits), scale[c], mn[c]);
    return local;
  }

  // Per channel, the smallest and largest key of quantized group `group` (< num_quantized_keys / group_size) as key()
  // decodes them: the decoded smallest and largest code present, since decoding, fp16(fp16(code x scale) + minimum)
  // with scale >= 0, never decreases as the code grows.
  void key_group_bounds(int32_t group, float* lo, float* hi) const {
    const QuantizedKvView& qv = view->quantized;
    const char* base = page(group * qv.group_size);
    const auto* words = reinterpret_cast<const uint32_t*>(base + layout->key_codes);
    const auto* scale = reinterpret_cast<const uint16_t*>(base + layout->key_scale);
    const auto* mn = reinterpret_cast<const uint16_t*>(base + layout->key_min);
    for (int32_t c = 0; c < view->head_dim; ++c) {
      const uint32_t* channel = words + int64_t{c} * layout->key_words;
      uint32_t least = kivi_code(channel, 0, qv.bits), most = least;
      for (int32_t t = 1; t < qv.group_size; ++t) {
        const uint32_t code = kivi_code(channel, t, qv.bits);
        least = std::min(least, code);
        most = std::max(most, code);
      }
      lo[c] = kivi_dequantize(least, scale[c], mn[c]);
      hi[c] = kivi_dequantize(most, scale[c], mn[c]);
    }
  }

  const float* value(int32_t j, float* local) const {
    if (j >= num_quantized_values) return residual_row(1, j);
    const QuantizedKvView& qv = view->quantized;
    const char* base = page(j);
    const int32_t t = j % qv.group_size;
    const auto* words =
        reinterpret_cast<const uint32_t*>(base + layout->value_codes) + int64_t{t} * layout->value_words;
    const auto* scale =
        reinterpret_cast<const uint16_t*>(base + layout->value_scale) + int64_t{t} * layout->value_groups;
    const auto* mn = reinterpret_cast<const uint16_t*>(base + layout->value_min) + int64_t{t} * layout->value_groups;
    kivi_dequantize_row(words, scale, mn, view->head_dim, qv.value_group_size, qv.bits, local, 1);
    return local;
  }
};

}  // namespace se::cpu
