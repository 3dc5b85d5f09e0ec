// quantized_attention_tool: builds FP8, KIVI or TurboQuant pages (attention_view.h's kQuantized layouts) for a ragged
// batch with the engine's quantizers and runs paged_attention over them, for test_quantized_attention.py to compare
// against attention over the numpy oracles' dequantized K/V. Each sequence's stream holds its whole K/V as a
// prefill leaves it; its last ROWS[s] tokens are the query rows. Physical pages are handed out in a shuffled
// order, so the page lists are not the identity. Files are raw little-endian arrays in DIR:
//   lens.i32 [S], rows.i32 [S], q.f32 [sum rows, H, D], k.f32 and v.f32 [sum lens, HKV, D] (sequences in order)
//   fp8 H HKV D PAGE_SIZE WINDOW DIR         also scales.f32 [2][HKV] (k then v); e4m3 pages
//   kivi BITS GROUP VGROUP R H HKV D PAGE_SIZE WINDOW DIR
//       quantized keys and values as KiviResidualWindow leaves them after the prefill; the residual tokens
//       start at slot (first full-precision token) % PAGE_SIZE of their pages, as a window that slid would leave
//       them; prints "quantized_keys quantized_values" per sequence
//   turboquant STORE H HKV D PAGE_SIZE WINDOW DIR
//       slots of the turboquant_* store, every token encoded by the store's codec; the paper's stores
//       (turboquant_2.5|3.5) with each KV head's outlier channels fixed from all of the batch's tokens, as a layer's
//       first batch fixes them
// Writes DIR/out.f32 [sum rows, H, D].
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/quant/fp8_kv.h"
#include "backend/quant/kivi_quant.h"
#include "backend/quant/quantized_kv_layout.h"
#include "backend/quant/turboquant_kv.h"
#include "backend/quant/turboquant_prod_kv.h"
#include "kv/kv_store_kind.h"
#include "kv/kivi_residual_window.h"
#include "kv/turboquant_channel_table.h"
#include "../support/array_files.h"

using se::AttentionView;
using se::AttentionParams;
using se::DType;
using se::KiviSeqView;
using se::KvPayload;
using se::KvQuantScheme;
using se::QuantizedKvView;
using se::SeqKvView;
using se::Shape;
using se::TensorView;

using se::test::read_array;
using se::test::write_array;

namespace {

// The batch as read from DIR.
struct Batch {
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0, page_size = 0, window = 0;
  std::vector<int32_t> lens, rows, q_indptr, token_begin;
  std::vector<float> q, k, v;

  int32_t num_seqs() const { return static_cast<int32_t>(lens.size()); }
  // K/V row of token t of sequence s, KV head h.
  int64_t kv_offset(int32_t s, int32_t t, int32_t h) const {
    return ((int64_t{token_begin[s]} + t) * num_kv_heads + h) * head_dim;
  }
};

Batch read_batch(char** dims, const std::string& dir) {
  Batch b;
  b.num_heads = std::stoi(dims[0]), b.num_kv_heads = std::stoi(dims[1]), b.head_dim = std::stoi(dims[2]);
  b.page_size = std::stoi(dims[3]), b.window = std::stoi(dims[4]);
  b.lens = read_array<int32_t>(dir + "/lens.i32");
  b.rows = read_array<int32_t>(dir + "/rows.i32");
  b.q = read_array<float>(dir + "/q.f32");
  b.k = read_array<float>(dir + "/k.f32");
  b.v = read_array<float>(dir + "/v.f32");
  b.q_indptr = {0};
  b.token_begin = {0};
  for (int32_t s = 0; s < b.num_seqs(); ++s) {
    b.q_indptr.push_back(b.q_indptr.back() + b.rows[s]);
    b.token_begin.push_back(b.token_begin.back() + b.lens[s]);
  }
  return b;
}

// Page lists of every (sequence, KV head) stream of one pool, page ids handed out in a shuffled order.
struct Streams {
  std::vector<std::vector<int32_t>> page_ids, num_tokens;  // per sequence: [HKV][stride], [HKV]
  std::vector<SeqKvView> views;
  int32_t num_pages = 0;

  // pages[s] and tokens[s]: the pages and tokens of each of sequence s's KV heads.
  Streams(const std::vector<int32_t>& pages, const std::vector<int32_t>& tokens, int32_t num_kv_heads,
          std::mt19937& rng) {
    for (int32_t n : pages) num_pages += n * num_kv_heads;
    std::vector<int32_t> order(static_cast<size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    size_t next = 0;
    for (size_t s = 0; s < pages.size(); ++s) {
      page_ids.emplace_back(order.begin() + static_cast<int64_t>(next),
                            order.begin() + static_cast<int64_t>(next + pages[s] * num_kv_heads));
      next += static_cast<size_t>(pages[s] * num_kv_heads);
      num_tokens.emplace_back(static_cast<size_t>(num_kv_heads), tokens[s]);
    }
    for (size_t s = 0; s < pages.size(); ++s)
      views.push_back(SeqKvView{page_ids[s].data(), pages[s], num_tokens[s].data()});
  }
  // The page holding slot `slot` of sequence s, KV head h.
  int32_t page(int32_t s, int32_t h, int32_t slot, int32_t slots_per_page) const {
    return page_ids[s][static_cast<size_t>(h * views[s].stride + slot / slots_per_page)];
  }
};

int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

// Pages of each sequence's stream when every slot lives in a page of page_size tokens.
std::vector<int32_t> whole_pages(const Batch& b) {
  std::vector<int32_t> pages;
  pages.reserve(b.lens.size());
  for (int32_t len : b.lens) pages.push_back(ceil_div(len, b.page_size));
  return pages;
}

AttentionView base_view(const Batch& b, const Streams& streams) {
  AttentionView view;
  view.page_size = b.page_size;
  view.head_dim = b.head_dim;
  view.num_kv_heads = b.num_kv_heads;
  view.num_seqs = b.num_seqs();
  view.q_indptr = b.q_indptr.data();
  view.seqs = streams.views.data();
  view.payload = KvPayload::kQuantized;
  return view;
}

void attend_and_write(const Batch& b, const AttentionView& view, const std::string& dir) {
  std::vector<float> q = b.q, out(b.q.size());
  const int64_t rows = b.q_indptr.back();
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(b.head_dim));
  params.sliding_window = b.window;
  paged_attention(TensorView{out.data(), DType::kF32, Shape{rows, b.num_heads, b.head_dim}},
                  TensorView{q.data(), DType::kF32, Shape{rows, b.num_heads, b.head_dim}}, view, params);
  write_array(dir + "/out.f32", out);
}

int fp8(char** argv) {
  const std::string dir = argv[7];
  const Batch b = read_batch(argv + 2, dir);
  const std::vector<float> scales = read_array<float>(dir + "/scales.f32");  // [2][HKV]
  std::mt19937 rng(11);
  const Streams streams(whole_pages(b), b.lens, b.num_kv_heads, rng);
  const size_t page_bytes = static_cast<size_t>(b.page_size) * se::fp8_kv_bytes_per_token(b.head_dim);
  std::vector<uint8_t> pool(static_cast<size_t>(streams.num_pages) * page_bytes);
  AttentionView view = base_view(b, streams);
  view.kv_base = pool.data();
  view.kv_dtype = DType::kU8;
  view.page_bytes = page_bytes;
  view.quantized.scheme = KvQuantScheme::kFp8E4M3;
  view.quantized.k_scales = scales.data();
  view.quantized.v_scales = scales.data() + b.num_kv_heads;
  for (int32_t s = 0; s < b.num_seqs(); ++s)
    for (int32_t h = 0; h < b.num_kv_heads; ++h)
      for (int32_t t = 0; t < b.lens[s]; ++t)
        for (int kv = 0; kv < 2; ++kv)
          se::fp8_quantize((kv == 0 ? b.k : b.v).data() + b.kv_offset(s, t, h), static_cast<size_t>(b.head_dim),
                           scales[static_cast<size_t>(kv * b.num_kv_heads + h)], se::Fp8Format::kE4M3,
                           view.element<uint8_t>(streams.page(s, h, t, b.page_size), kv, t % b.page_size));
  attend_and_write(b, view, dir);
  return 0;
}

int kivi(char** argv) {
  const int32_t bits = std::stoi(argv[2]), group = std::stoi(argv[3]), value_group = std::stoi(argv[4]);
  const int64_t residual = std::stoll(argv[5]);
  const std::string dir = argv[11];
  const Batch b = read_batch(argv + 6, dir);
  const int32_t d = b.head_dim, ps = b.page_size;
  std::vector<int32_t> quantized_keys, quantized_values, full, first_slot;
  std::vector<int32_t> quantized_pages, residual_pages;
  for (int32_t len : b.lens) {
    se::KiviResidualWindow window(residual);
    window.append(len);
    quantized_keys.push_back(static_cast<int32_t>(window.quantized_keys()));
    quantized_values.push_back(static_cast<int32_t>(window.quantized_values()));
    full.push_back(len - quantized_values.back());
    first_slot.push_back(quantized_values.back() % ps);
    quantized_pages.push_back(quantized_keys.back() / group);
    residual_pages.push_back(ceil_div(full.back() + first_slot.back(), ps));
    std::printf("%d %d\n", quantized_keys.back(), quantized_values.back());
  }
  std::mt19937 rng(13);
  const Streams quantized(quantized_pages, b.lens, b.num_kv_heads, rng);
  const Streams residual_streams(residual_pages, full, b.num_kv_heads, rng);
  const se::KiviPageLayout layout = se::kivi_page_layout(group, value_group, d, bits);
  std::vector<char> pool(static_cast<size_t>(quantized.num_pages) * layout.page_bytes);
  const size_t explicit_page_bytes = 2 * static_cast<size_t>(ps) * static_cast<size_t>(d) * sizeof(float);
  std::vector<float> residual_pool(static_cast<size_t>(residual_streams.num_pages) * explicit_page_bytes /
                                   sizeof(float));

  std::vector<std::vector<int32_t>> per_head(3 * static_cast<size_t>(b.num_seqs()));
  std::vector<KiviSeqView> kivi_seqs;
  for (int32_t s = 0; s < b.num_seqs(); ++s) {
    auto& keys = per_head[3 * s] = std::vector<int32_t>(static_cast<size_t>(b.num_kv_heads), quantized_keys[s]);
    auto& values = per_head[3 * s + 1] =
        std::vector<int32_t>(static_cast<size_t>(b.num_kv_heads), quantized_values[s]);
    auto& first = per_head[3 * s + 2] = std::vector<int32_t>(static_cast<size_t>(b.num_kv_heads), first_slot[s]);
    kivi_seqs.push_back(KiviSeqView{keys.data(), values.data(), residual_streams.views[s], first.data()});
  }
  AttentionView view = base_view(b, quantized);
  view.kv_base = residual_pool.data();
  view.kv_dtype = DType::kF32;
  view.page_bytes = explicit_page_bytes;
  QuantizedKvView& qv = view.quantized;
  qv.scheme = KvQuantScheme::kKivi;
  qv.quantized_base = pool.data();
  qv.quantized_page_bytes = layout.page_bytes;
  qv.bits = bits;
  qv.group_size = group;
  qv.value_group_size = value_group;
  qv.kivi_seqs = kivi_seqs.data();

  const int64_t token_stride = int64_t{b.num_kv_heads} * d;
  for (int32_t s = 0; s < b.num_seqs(); ++s)
    for (int32_t h = 0; h < b.num_kv_heads; ++h) {
      for (int32_t p = 0; p < quantized_pages[s]; ++p) {
        char* page = pool.data() + static_cast<size_t>(quantized.page(s, h, p * group, group)) * layout.page_bytes;
        auto* key_words = reinterpret_cast<uint32_t*>(page + layout.key_codes);
        auto* key_scale = reinterpret_cast<uint16_t*>(page + layout.key_scale);
        auto* key_min = reinterpret_cast<uint16_t*>(page + layout.key_min);
        for (int32_t c = 0; c < d; ++c)  // one group per channel over the page's tokens
          se::kivi_quantize_row(b.k.data() + b.kv_offset(s, p * group, h) + c, group, token_stride, group, bits,
                                key_words + int64_t{c} * layout.key_words, key_scale + c, key_min + c);
        auto* value_words = reinterpret_cast<uint32_t*>(page + layout.value_codes);
        auto* value_scale = reinterpret_cast<uint16_t*>(page + layout.value_scale);
        auto* value_min = reinterpret_cast<uint16_t*>(page + layout.value_min);
        for (int32_t t = 0; t < group && p * group + t < quantized_values[s]; ++t)  // per token
          se::kivi_quantize_row(b.v.data() + b.kv_offset(s, p * group + t, h), d, 1, value_group, bits,
                                value_words + int64_t{t} * layout.value_words,
                                value_scale + int64_t{t} * layout.value_groups,
                                value_min + int64_t{t} * layout.value_groups);
      }
      for (int32_t j = quantized_values[s]; j < b.lens[s]; ++j) {
        const int32_t slot = j - quantized_values[s] + first_slot[s];
        const int32_t page = residual_streams.page(s, h, slot, ps);
        for (int kv = 0; kv < 2; ++kv)
          std::memcpy(view.element<float>(page, kv, slot % ps), (kv == 0 ? b.k : b.v).data() + b.kv_offset(s, j, h),
                      sizeof(float) * static_cast<size_t>(d));
      }
    }
  attend_and_write(b, view, dir);
  return 0;
}

// Whole pages of fixed-size slots, one per token and KV head (a TurboQuant store's record), for b's sequences in a
// shuffled page order, and the view over them with the TurboQuant payload; the caller sets the codec's fields and
// encodes each slot.
struct SlotPool {
  std::mt19937 rng{17};
  Streams streams;
  size_t slot_bytes, page_bytes;
  std::vector<uint8_t> bytes;
  AttentionView view;

  SlotPool(const Batch& b, size_t slot_size)
      : streams(whole_pages(b), b.lens, b.num_kv_heads, rng),
        slot_bytes(slot_size),
        page_bytes(static_cast<size_t>(b.page_size) * slot_size),
        bytes(static_cast<size_t>(streams.num_pages) * page_bytes),
        view(base_view(b, streams)) {
    view.kv_base = bytes.data();
    view.kv_dtype = DType::kU8;
    view.page_bytes = page_bytes;
    view.quantized.scheme = KvQuantScheme::kTurboQuant;
  }
  SlotPool(const SlotPool&) = delete;  // the view points into `streams`

  uint8_t* slot(const Batch& b, int32_t s, int32_t h, int32_t t) {
    return bytes.data() + static_cast<size_t>(streams.page(s, h, t, b.page_size)) * page_bytes +
           static_cast<size_t>(t % b.page_size) * slot_bytes;
  }
};

// The paper's store at `bits`.
int turboquant_prod(int32_t bits, Batch b, const std::string& dir) {
  const int64_t tokens = b.token_begin.back();
  se::TurboQuantChannelTable channels(1, b.num_kv_heads, b.head_dim);
  channels.calibrate(0, TensorView{b.k.data(), DType::kF32, Shape{tokens, b.num_kv_heads, b.head_dim}},
                     TensorView{b.v.data(), DType::kF32, Shape{tokens, b.num_kv_heads, b.head_dim}});
  const se::TurboQuantProdKvCodec codec(b.head_dim, bits);
  SlotPool pool(b, codec.layout().slot_bytes());
  QuantizedKvView& qv = pool.view.quantized;
  qv.bits = qv.value_bits = bits;
  qv.turboquant_prod = &codec;
  qv.key_orders = channels.key_orders(0);
  qv.value_orders = channels.value_orders(0);
  for (int32_t s = 0; s < b.num_seqs(); ++s)
    for (int32_t h = 0; h < b.num_kv_heads; ++h)
      for (int32_t t = 0; t < b.lens[s]; ++t)
        codec.encode(b.k.data() + b.kv_offset(s, t, h), b.v.data() + b.kv_offset(s, t, h),
                     qv.key_orders + int64_t{h} * b.head_dim, qv.value_orders + int64_t{h} * b.head_dim,
                     pool.slot(b, s, h, t));
  attend_and_write(b, pool.view, dir);
  return 0;
}

int turboquant(char** argv) {
  const se::Result<se::KvStoreKind> store = se::parse_kv_cache_dtype(argv[2]);
  if (!store.is_ok() || !se::is_turboquant(*store)) return 2;
  const std::string dir = argv[8];
  const Batch b = read_batch(argv + 3, dir);
  const se::TurboQuantKvFormat format = se::turboquant_format(*store);
  if (format.outlier_split) return turboquant_prod(format.key_bits, b, dir);
  const se::TurboQuantKvCodec codec(b.head_dim, format);
  SlotPool pool(b, codec.layout().slot_bytes());
  QuantizedKvView& qv = pool.view.quantized;
  qv.bits = codec.format().key_bits;
  qv.value_bits = codec.format().value_bits;
  qv.norm_correction = codec.format().norm_correction;
  qv.rotation = codec.rotation().data();
  qv.centroids = codec.centroids().data();
  for (int32_t s = 0; s < b.num_seqs(); ++s)
    for (int32_t h = 0; h < b.num_kv_heads; ++h)
      for (int32_t t = 0; t < b.lens[s]; ++t)
        codec.encode(b.k.data() + b.kv_offset(s, t, h), b.v.data() + b.kv_offset(s, t, h), pool.slot(b, s, h, t));
  attend_and_write(b, pool.view, dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "fp8" && argc == 8) return fp8(argv);
  if (cmd == "kivi" && argc == 12) return kivi(argv);
  if (cmd == "turboquant" && argc == 9) return turboquant(argv);
  std::fprintf(stderr, "usage: see the header of quantized_attention_tool.cpp\n");
  return 2;
}
