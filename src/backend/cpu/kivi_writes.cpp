// The KIVI store's writes on the CPU (attention_view.h, kKivi): the step's new rows into each stream's f32 window,
// and a flush's window rows into the quantized pages by kivi_quantize_row, keys per channel over a group's tokens and
// values per token.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/quant/kivi_quant.h"
#include "backend/quant/quantized_kv_layout.h"

namespace se::cpu {

namespace {
// Row kv (0 = K, 1 = V) of window row `row` (page * page_size + slot).
const float* window_row(const AttentionView& pool, int kv, int64_t row) {
  return pool.element<const float>(static_cast<int32_t>(row / pool.page_size), kv,
                                   static_cast<int32_t>(row % pool.page_size));
}
}  // namespace

void write_kivi_window(const AttentionView& view, TensorView k, TensorView v) {
  const int32_t dim = view.head_dim, heads = view.num_kv_heads;
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const SeqKvView& window = view.quantized.kivi_seqs[s].residual;
    const int32_t* first_slot = view.quantized.kivi_seqs[s].residual_first_slot;
    const int32_t n = view.q_indptr[s + 1] - view.q_indptr[s];
    for (int32_t h = 0; h < heads; ++h) {
      const int32_t* pages = window.page_ids + static_cast<int64_t>(h) * window.stride;
      for (int32_t r = 0; r < n; ++r) {
        const int32_t slot = window.num_tokens[h] - n + r + first_slot[h];
        const size_t source = (static_cast<size_t>(view.q_indptr[s] + r) * heads + static_cast<size_t>(h)) * dim;
        const int32_t page = pages[slot / view.page_size], offset = slot % view.page_size;
        std::memcpy(view.element<float>(page, 0, offset), k.ptr<const float>() + source, row_bytes);
        std::memcpy(view.element<float>(page, 1, offset), v.ptr<const float>() + source, row_bytes);
      }
    }
  }
}

void quantize_kivi_rows(const AttentionView& pool, const KiviFlushRows& rows) {
  const QuantizedKvView& qv = pool.quantized;
  const int32_t group = qv.group_size, dim = pool.head_dim;
  const KiviPageLayout layout = kivi_page_layout(group, qv.value_group_size, dim, qv.bits);
  auto page = [&](int32_t id) {
    return static_cast<char*>(const_cast<void*>(qv.quantized_base)) + static_cast<size_t>(id) * layout.page_bytes;
  };
  // Keys: the group's rows side by side, then one strided row per channel.
  std::vector<float> keys(static_cast<size_t>(group) * static_cast<size_t>(dim));
  for (size_t g = 0; g < rows.key_pages.size(); ++g) {
    for (int32_t t = 0; t < group; ++t)
      std::memcpy(&keys[static_cast<size_t>(t) * static_cast<size_t>(dim)],
                  window_row(pool, 0, rows.key_rows[g * static_cast<size_t>(group) + static_cast<size_t>(t)]),
                  static_cast<size_t>(dim) * sizeof(float));
    char* target = page(rows.key_pages[g]);
    auto* words = reinterpret_cast<uint32_t*>(target + layout.key_codes);
    auto* scale = reinterpret_cast<uint16_t*>(target + layout.key_scale);
    auto* mn = reinterpret_cast<uint16_t*>(target + layout.key_min);
    for (int32_t c = 0; c < dim; ++c)
      kivi_quantize_row(&keys[static_cast<size_t>(c)], group, dim, group, qv.bits,
                        words + static_cast<int64_t>(c) * layout.key_words, &scale[c], &mn[c]);
  }
  for (size_t i = 0; i < rows.value_pages.size(); ++i) {
    char* target = page(rows.value_pages[i]);
    const int64_t t = rows.value_slots[i];
    kivi_quantize_row(window_row(pool, 1, rows.value_rows[i]), dim, 1, qv.value_group_size, qv.bits,
                      reinterpret_cast<uint32_t*>(target + layout.value_codes) + t * layout.value_words,
                      reinterpret_cast<uint16_t*>(target + layout.value_scale) + t * layout.value_groups,
                      reinterpret_cast<uint16_t*>(target + layout.value_min) + t * layout.value_groups);
  }
}

}  // namespace se::cpu
