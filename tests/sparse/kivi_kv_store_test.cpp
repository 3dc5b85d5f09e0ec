// The KIVI stores (--kv-cache-dtype kivi2 | kivi4) of KiviCacheManager: after every step, attention over the
// cache's view equals attention over the K/V the store must hold (keys of each whole R-token block quantized per
// channel in groups, values older than the last R tokens quantized per token, the rest exact), the quantizer being
// kivi_quant.h's, bit-exact against the numpy oracle of KIVI's new_pack.py (quantized_kv_test); a prompt written in
// chunks leaves the same store as one written at once; pages are counted exactly (pages_to_reserve, the layout's
// pages_per_stream, check_integrity) and all return to the pool; snapshots move the state; and the store refuses
// what it cannot hold. Under a compress-after method the store holds the prompt at full precision until it is
// computed, evicts from it per stream (streams may then differ in length), and quantizes the kept tokens only: the
// view is then KIVI over exactly the kept rows, chunked and one-shot prompts store the same, and evicting tokens
// that were quantized is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "backend/ops.h"
#include "backend/quant/kivi_quant.h"
#include "sparse/kivi_cache_manager.h"
#include "sparse/method_registry.h"
#include "sparse/method_traits.h"

namespace se {
namespace {

// kMaxStep: the longest step below (a one-shot prefill of 200 tokens).
constexpr int kLayers = 2, kHeads = 2, kDim = 64, kGroup = 32, kResidual = 64, kMaxStep = 200;

KvLayout kivi_layout(KvStoreKind store) {
  return make_kv_layout(kLayers, kHeads, kDim, 16, Device::kCpu, store, kGroup, kResidual, kMaxStep);
}

// K or V rows of every token of a run: [token][layer][head][dim].
struct Rows {
  std::vector<float> k, v;
  float* at(std::vector<float>& x, int64_t t, int layer, int h) {
    return x.data() + ((t * kLayers + layer) * kHeads + h) * kDim;
  }
};

Rows random_rows(std::mt19937& rng, int64_t tokens) {
  Rows r;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  r.k.resize(static_cast<size_t>(tokens * kLayers * kHeads * kDim));
  r.v.resize(r.k.size());
  for (float& x : r.k) x = normal(rng);
  for (float& x : r.v) x = 2.0f * normal(rng);
  return r;
}

// Reserves and writes tokens [begin, begin + n) of `rows` for sequence 0 in every layer (the step's forward).
void write_step(KiviCacheManager& cache, Rows& rows, int64_t begin, int32_t n) {
  const int64_t free_before = cache.num_free_pages();
  const int64_t expected_taken = cache.pages_to_reserve(0, n);
  ASSERT_TRUE(cache.reserve(0, n).is_ok());
  EXPECT_EQ(free_before - cache.num_free_pages(), expected_taken);
  // The step's peak, its window not flushed yet, is within what the layout budgets for the new length (what
  // the scheduler's can_ever_fit reads).
  EXPECT_LE(cache.num_held_pages(0), cache.layout().pages_for_tokens(cache.num_logical_tokens(0)));
  ForwardBatch batch;
  batch.sequences.push_back({0, 0, n});
  for (int layer = 0; layer < kLayers; ++layer) {
    Tensor k = Tensor::empty(DType::kF32, Shape{n, kHeads, kDim});
    Tensor v = Tensor::empty(DType::kF32, Shape{n, kHeads, kDim});
    for (int32_t r = 0; r < n; ++r)
      for (int h = 0; h < kHeads; ++h) {
        std::copy_n(rows.at(rows.k, begin + r, layer, h), kDim, k.data<float>() + (r * kHeads + h) * kDim);
        std::copy_n(rows.at(rows.v, begin + r, layer, h), kDim, v.data<float>() + (r * kHeads + h) * kDim);
      }
    cache.write(layer, cache.build_view(layer, batch), k.view(), v.view());
  }
}

// Appends tokens [begin, begin + n) of `rows` to sequence 0 as one step: reserve, every layer's write, on_computed.
void step(KiviCacheManager& cache, Rows& rows, int64_t begin, int32_t n) {
  write_step(cache, rows, begin, n);
  cache.on_computed(0, {}, cache.num_logical_tokens(0));
  ASSERT_TRUE(cache.check_integrity().is_ok()) << cache.check_integrity().to_string();
}

// Tokens [0, len).
std::vector<int32_t> first_tokens(int64_t len) {
  std::vector<int32_t> tokens(static_cast<size_t>(len));
  for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<int32_t>(t);
  return tokens;
}

// What the store holds for a stream of the tokens `tokens` of `rows`, in that order: [len][dim] keys and values,
// quantized as KIVI quantizes them.
void expected_stream(Rows& rows, int layer, int h, const std::vector<int32_t>& tokens, int bits, std::vector<float>& k,
                     std::vector<float>& v) {
  const auto len = static_cast<int64_t>(tokens.size());
  k.assign(static_cast<size_t>(len * kDim), 0.0f);
  v.assign(k.size(), 0.0f);
  for (int64_t t = 0; t < len; ++t) {
    std::copy_n(rows.at(rows.k, tokens[static_cast<size_t>(t)], layer, h), kDim, &k[static_cast<size_t>(t * kDim)]);
    std::copy_n(rows.at(rows.v, tokens[static_cast<size_t>(t)], layer, h), kDim, &v[static_cast<size_t>(t * kDim)]);
  }
  const int64_t keys = len / kResidual * kResidual, values = len > kResidual ? len - kResidual : 0;
  std::vector<uint32_t> words(static_cast<size_t>(kivi_num_words(kDim, bits)));
  std::vector<uint16_t> scale(2), mn(2);
  for (int64_t g = 0; g < keys; g += kGroup)
    for (int c = 0; c < kDim; ++c) {
      float* x = &k[static_cast<size_t>(g * kDim + c)];
      kivi_quantize_row(x, kGroup, kDim, kGroup, bits, words.data(), scale.data(), mn.data());
      kivi_dequantize_row(words.data(), scale.data(), mn.data(), kGroup, kGroup, bits, x, kDim);
    }
  for (int64_t t = 0; t < values; ++t) {
    float* x = &v[static_cast<size_t>(t * kDim)];
    kivi_quantize_row(x, kDim, 1, kGroup, bits, words.data(), scale.data(), mn.data());
    kivi_dequantize_row(words.data(), scale.data(), mn.data(), kDim, kGroup, bits, x, 1);
  }
}

// One query row per head over layer `layer` of sequence 0 (it sees every stored token), through the cache's view.
Tensor attend(KiviCacheManager& cache, int layer, const Tensor& q) {
  AttentionView view = cache.build_sequence_view(0, layer);
  const int32_t one_row[2] = {0, 1};
  view.q_indptr = one_row;
  Tensor out = Tensor::zeros(DType::kF32, Shape{1, kHeads, kDim});
  paged_attention(out.view(), q.view(), view, AttentionParams{1.0f / std::sqrt(float{kDim})});
  return out;
}

Tensor random_query(std::mt19937& rng) {
  Tensor q = Tensor::empty(DType::kF32, Shape{1, kHeads, kDim});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = normal(rng);
  return q;
}

// Attention of q over the expected K/V of every stream of layer `layer`, head h's stream holding tokens[h].
Tensor attend_expected(Rows& rows, int layer, const std::vector<std::vector<int32_t>>& tokens, int bits,
                       const Tensor& q) {
  Tensor out = Tensor::zeros(DType::kF32, Shape{1, kHeads, kDim});
  std::vector<float> hk, hv;
  for (int h = 0; h < kHeads; ++h) {
    expected_stream(rows, layer, h, tokens[static_cast<size_t>(h)], bits, hk, hv);
    const auto len = static_cast<int64_t>(tokens[static_cast<size_t>(h)].size());
    Tensor k = Tensor::empty(DType::kF32, Shape{len, 1, kDim});
    Tensor v = Tensor::empty(DType::kF32, Shape{len, 1, kDim});
    std::copy(hk.begin(), hk.end(), k.data<float>());
    std::copy(hv.begin(), hv.end(), v.data<float>());
    Tensor q_pos = Tensor::empty(DType::kI32, Shape{1});
    Tensor k_pos = Tensor::empty(DType::kI32, Shape{len});
    q_pos.data<int32_t>()[0] = static_cast<int32_t>(len - 1);
    for (int64_t t = 0; t < len; ++t) k_pos.data<int32_t>()[t] = static_cast<int32_t>(t);
    Tensor head_q = Tensor::empty(DType::kF32, Shape{1, 1, kDim});
    std::copy_n(q.data<float>() + h * kDim, kDim, head_q.data<float>());
    Tensor head_out = Tensor::zeros(DType::kF32, Shape{1, 1, kDim});
    attention(head_out.view(), head_q.view(), k.view(), v.view(), q_pos.view(), k_pos.view(),
              AttentionParams{1.0f / std::sqrt(float{kDim})});
    std::copy_n(head_out.data<float>(), kDim, out.data<float>() + h * kDim);
  }
  return out;
}

Tensor attend_expected(Rows& rows, int layer, int64_t len, int bits, const Tensor& q) {
  return attend_expected(rows, layer, std::vector<std::vector<int32_t>>(kHeads, first_tokens(len)), bits, q);
}

std::unique_ptr<KiviCacheManager> make_cache(KvStoreKind store, int32_t num_pages = 4096, bool hold_prompts = false) {
  auto made = KiviCacheManager::create(kivi_layout(store), num_pages, cpu_allocator(), hold_prompts);
  SE_CHECK(made.is_ok(), "{}", made.status().to_string());
  return std::move(*made);
}

class KiviKvStoreTest : public ::testing::TestWithParam<KvStoreKind> {};

TEST_P(KiviKvStoreTest, AttentionOverTheViewIsAttentionOverWhatKiviStores) {
  const KvStoreKind store = GetParam();
  const int bits = kivi_bits(store);
  std::mt19937 rng(5);
  Rows rows = random_rows(rng, 260);
  auto cache = make_cache(store);
  ASSERT_TRUE(cache->open(0, {}).is_ok());
  // A chunked prefill (partial groups, a chunk crossing R), then decode steps through two more key flushes and
  // the value window's slide.
  std::vector<int32_t> chunks = {37, 50, 30};
  while (chunks.size() < 3 + 143) chunks.push_back(1);
  int64_t len = 0;
  for (int32_t n : chunks) {
    step(*cache, rows, len, n);
    len += n;
    if (n > 1 || len % 29 == 0 || len % kResidual <= 1) {
      for (int layer = 0; layer < kLayers; ++layer) {
        const Tensor q = random_query(rng);
        const Tensor got = attend(*cache, layer, q);
        const Tensor want = attend_expected(rows, layer, len, bits, q);
        for (int64_t i = 0; i < got.numel(); ++i)
          ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-4f) << "len " << len << " layer " << layer;
      }
    }
  }
  EXPECT_EQ(len, 260);
  cache->close(0);
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
  EXPECT_TRUE(cache->check_integrity().is_ok());
}

TEST_P(KiviKvStoreTest, ChunkedPrefillLeavesTheStoreOfAOneShotPrefill) {
  const KvStoreKind store = GetParam();
  std::mt19937 rng(6);
  Rows rows = random_rows(rng, 240);
  auto chunked = make_cache(store), one_shot = make_cache(store);
  ASSERT_TRUE(chunked->open(0, {}).is_ok());
  ASSERT_TRUE(one_shot->open(0, {}).is_ok());
  int64_t len = 0;
  for (int32_t n : {1, 31, 64, 17, 47, 40}) {
    step(*chunked, rows, len, n);
    len += n;
  }
  step(*one_shot, rows, 0, 200);
  EXPECT_EQ(chunked->num_held_pages(0), one_shot->num_held_pages(0));
  // Then the same decode steps: attention agrees bit for bit, as both hold the same codes and rows.
  for (int64_t t = 200; t < 240; ++t) {
    step(*chunked, rows, t, 1);
    step(*one_shot, rows, t, 1);
  }
  for (int layer = 0; layer < kLayers; ++layer) {
    const Tensor q = random_query(rng);
    const Tensor a = attend(*chunked, layer, q), b = attend(*one_shot, layer, q);
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << layer;
  }
}

TEST_P(KiviKvStoreTest, SnapshotsCarryTheStateAndGiveItsPagesBack) {
  const KvStoreKind store = GetParam();
  std::mt19937 rng(7);
  Rows rows = random_rows(rng, 100);
  auto cache = make_cache(store);
  ASSERT_TRUE(cache->open(0, {}).is_ok());
  step(*cache, rows, 0, 100);
  const Tensor q = random_query(rng);
  const Tensor before = attend(*cache, 1, q);
  const int64_t held = cache->num_held_pages(0);
  std::unique_ptr<SequenceSnapshot> snap = cache->snapshot(0);
  EXPECT_EQ(snap->num_held_pages(), held);
  EXPECT_EQ(snap->num_logical_tokens(), 100);
  ASSERT_TRUE(cache->restore(0, std::move(snap)).is_ok());
  const Tensor after = attend(*cache, 1, q);
  for (int64_t i = 0; i < before.numel(); ++i) EXPECT_EQ(before.data<float>()[i], after.data<float>()[i]);
  // A snapshot dropped unrestored returns its pages.
  cache->snapshot(0).reset();
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
}

// A prompt of `len` tokens for a compress-after method, written in `chunks` into a store that holds prompts, then
// every stream evicted to kept[stream] before the step is reported computed. Returns what each stream holds.
std::vector<std::vector<int32_t>> held_prompt_then_evict(KiviCacheManager& cache, Rows& rows,
                                                         const std::vector<int32_t>& chunks, std::mt19937& rng) {
  const int32_t len = std::accumulate(chunks.begin(), chunks.end(), 0);
  const std::vector<int32_t> prompt(static_cast<size_t>(len), 1);
  EXPECT_TRUE(cache.open(0, prompt).is_ok());
  int32_t begin = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    write_step(cache, rows, begin, chunks[c]);
    begin += chunks[c];
    // The prompt stays whole at full precision until it is computed, within what the layout budgets for it.
    EXPECT_LE(cache.num_held_pages(0), KiviCacheManager::held_prompt_pages(cache.layout(), len));
    AttentionView view = cache.build_sequence_view(0, 0);
    EXPECT_EQ(view.quantized.kivi_seqs[0].num_quantized_keys[0], 0);
    EXPECT_EQ(view.quantized.kivi_seqs[0].num_quantized_values[0], 0);
    if (c + 1 < chunks.size()) {
      cache.on_computed(0, {}, begin);
      EXPECT_TRUE(cache.check_integrity().is_ok()) << cache.check_integrity().to_string();
    }
  }
  EXPECT_EQ(cache.num_held_pages(0), KiviCacheManager::held_prompt_pages(cache.layout(), len));
  // Kept sets as the SnapKV family's: per stream, ascending, of differing lengths (a per-head or per-layer budget).
  std::vector<std::vector<int32_t>> kept(kLayers * kHeads);
  std::vector<KvStreams::StreamEviction> evictions;
  for (int layer = 0; layer < kLayers; ++layer)
    for (int h = 0; h < kHeads; ++h) {
      std::vector<int32_t>& stream = kept[static_cast<size_t>(layer) * kHeads + static_cast<size_t>(h)];
      const int32_t budget = 70 + 41 * layer + 13 * h;
      for (int32_t t = 0; t < len; ++t)
        if (static_cast<int32_t>(rng() % static_cast<uint32_t>(len)) < budget) stream.push_back(t);
      evictions.push_back({layer, h, stream});
    }
  const Status evicted = cache.evict_streams(0, evictions);
  EXPECT_TRUE(evicted.is_ok()) << evicted.to_string();
  EXPECT_TRUE(cache.check_integrity().is_ok()) << cache.check_integrity().to_string();
  cache.on_computed(0, {}, len);
  EXPECT_TRUE(cache.check_integrity().is_ok()) << cache.check_integrity().to_string();
  for (int layer = 0; layer < kLayers; ++layer)
    for (int h = 0; h < kHeads; ++h) {
      const std::vector<int32_t>& stream = kept[static_cast<size_t>(layer) * kHeads + static_cast<size_t>(h)];
      const std::span<const int32_t> positions = cache.slot_positions(0, layer, h);
      EXPECT_EQ(std::vector<int32_t>(positions.begin(), positions.end()), stream);
    }
  EXPECT_EQ(cache.num_logical_tokens(0), len);
  return kept;
}

// The tokens of `rows` each stream of layer `layer` holds, then `decoded` more (positions len, len + 1, ...).
std::vector<std::vector<int32_t>> layer_tokens(const std::vector<std::vector<int32_t>>& kept, int layer, int32_t len,
                                               int32_t decoded) {
  std::vector<std::vector<int32_t>> tokens(kept.begin() + layer * kHeads, kept.begin() + (layer + 1) * kHeads);
  for (std::vector<int32_t>& stream : tokens)
    for (int32_t t = len; t < len + decoded; ++t) stream.push_back(t);
  return tokens;
}

TEST_P(KiviKvStoreTest, AHeldPromptIsEvictedThenQuantizedFromTheKeptTokensOnly) {
  const KvStoreKind store = GetParam();
  const int bits = kivi_bits(store);
  std::mt19937 rng(8);
  const int32_t len = 200, decode = 90;
  Rows rows = random_rows(rng, len + decode);
  auto cache = make_cache(store, 4096, /*hold_prompts=*/true);
  const std::vector<std::vector<int32_t>> kept = held_prompt_then_evict(*cache, rows, {37, 100, 63}, rng);
  // After the prompt: KIVI over the kept rows, as if they were the prompt; then decode flushes as KIVI does.
  for (int32_t decoded = 0; decoded <= decode; ++decoded) {
    if (decoded > 0) step(*cache, rows, len + decoded - 1, 1);
    if (decoded % 15 != 0) continue;
    for (int layer = 0; layer < kLayers; ++layer) {
      const Tensor q = random_query(rng);
      const Tensor got = attend(*cache, layer, q);
      const Tensor want = attend_expected(rows, layer, layer_tokens(kept, layer, len, decoded), bits, q);
      for (int64_t i = 0; i < got.numel(); ++i)
        ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-4f) << "decoded " << decoded << " layer " << layer;
    }
  }
  cache->close(0);
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
  EXPECT_TRUE(cache->check_integrity().is_ok());
}

// A chain's state between turns: a compressed prompt and a few decode tokens, taken out and resumed. The next turn's
// tokens append in prefill chunks as KIVI appends decode tokens (attention over the store is attention over KIVI's
// quantization of the kept tokens and every later one), the step peaks stay within what the snapshot said its
// streams may grow by, and the tokens quantized before it can no longer be evicted.
TEST_P(KiviKvStoreTest, AResumedStateAppendsAsKiviWithinThePagesItsSnapshotPromised) {
  const KvStoreKind store = GetParam();
  const int bits = kivi_bits(store);
  std::mt19937 rng(12);
  const int32_t len = 200, decode = 5;
  const std::vector<int32_t> next_turn = {32, 32, 1, 32, 23};
  const int32_t appended = std::accumulate(next_turn.begin(), next_turn.end(), 0);
  Rows rows = random_rows(rng, len + decode + appended);
  auto cache = make_cache(store, 4096, /*hold_prompts=*/true);
  const std::vector<std::vector<int32_t>> kept = held_prompt_then_evict(*cache, rows, {37, 100, 63}, rng);
  for (int32_t t = len; t < len + decode; ++t) step(*cache, rows, t, 1);
  EXPECT_FALSE(cache->can_evict_streams(0));  // every stream kept more than R tokens: some are quantized

  std::unique_ptr<SequenceSnapshot> snap = cache->snapshot(0);
  const int64_t held = snap->num_held_pages();
  const int64_t extension = snap->num_pages_to_extend(appended).value_or(0);
  EXPECT_GT(extension, 0);
  EXPECT_EQ(cache->num_total_pages() - cache->num_free_pages(), held);
  ASSERT_TRUE(cache->restore(0, std::move(snap)).is_ok());
  int64_t peak = held;
  int64_t begin = len + decode;
  for (int32_t n : next_turn) {
    write_step(*cache, rows, begin, n);
    peak = std::max(peak, cache->num_held_pages(0));
    begin += n;
    cache->on_computed(0, {}, static_cast<int32_t>(begin));
    ASSERT_TRUE(cache->check_integrity().is_ok()) << cache->check_integrity().to_string();
  }
  EXPECT_GT(peak, held);
  EXPECT_LE(peak - held, extension);
  for (int layer = 0; layer < kLayers; ++layer) {
    const Tensor q = random_query(rng);
    const Tensor got = attend(*cache, layer, q);
    const Tensor want = attend_expected(rows, layer, layer_tokens(kept, layer, len, decode + appended), bits, q);
    for (int64_t i = 0; i < got.numel(); ++i) ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-4f) << layer;
  }
  EXPECT_EQ(cache->evict(0, 0, 0, {0, 1}).code(), StatusCode::kFailedPrecondition);
  cache->close(0);
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
  EXPECT_TRUE(cache->check_integrity().is_ok());
}

// One token more on a state whose windows hold R - 1 keys flushes a key group in every stream: more pages than the
// new token's own (what a method's peak for it counts), and no more than the snapshot said.
TEST_P(KiviKvStoreTest, ATokenThatFlushesAKeyGroupTakesNoMoreThanItsSnapshotPromised) {
  std::mt19937 rng(13);
  Rows rows = random_rows(rng, 2 * kResidual);
  auto cache = make_cache(GetParam());
  ASSERT_TRUE(cache->open(0, {}).is_ok());
  step(*cache, rows, 0, 2 * kResidual - 1);
  std::unique_ptr<SequenceSnapshot> snap = cache->snapshot(0);
  const int64_t held = snap->num_held_pages();
  const int64_t extension = snap->num_pages_to_extend(1).value_or(0);
  ASSERT_TRUE(cache->restore(0, std::move(snap)).is_ok());
  write_step(*cache, rows, 2 * kResidual - 1, 1);
  const int64_t growth = cache->num_held_pages(0) - held;
  EXPECT_GT(growth, KiviCacheManager::held_prompt_pages(cache->layout(), 1));
  EXPECT_LE(growth, extension);
  cache->on_computed(0, {}, 2 * kResidual);
  EXPECT_TRUE(cache->check_integrity().is_ok());
  cache->close(0);
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
}

TEST_P(KiviKvStoreTest, ChunkedAndOneShotHeldPromptsStoreTheSameBytes) {
  const KvStoreKind store = GetParam();
  std::mt19937 rng(9);
  Rows rows = random_rows(rng, 200);
  auto chunked = make_cache(store, 4096, true), one_shot = make_cache(store, 4096, true);
  std::mt19937 kept_rng(10), same_kept_rng(10);
  held_prompt_then_evict(*chunked, rows, {1, 31, 64, 17, 47, 40}, kept_rng);
  held_prompt_then_evict(*one_shot, rows, {200}, same_kept_rng);
  ASSERT_EQ(chunked->num_held_pages(0), one_shot->num_held_pages(0));
  // Each stream's quantized groups (key codes and parameters, and the value rows quantized so far) and window rows
  // are the same bytes in both, whichever pages hold them.
  const KiviPageLayout& pl = chunked->page_layout();
  const size_t key_code_bytes = static_cast<size_t>(kDim) * static_cast<size_t>(pl.key_words) * sizeof(uint32_t);
  const size_t key_param_bytes = 2 * static_cast<size_t>(kDim) * sizeof(uint16_t);  // scales, then minima
  const size_t value_code_bytes = static_cast<size_t>(pl.value_words) * sizeof(uint32_t);
  const size_t value_param_bytes = static_cast<size_t>(pl.value_groups) * sizeof(uint16_t);
  for (int layer = 0; layer < kLayers; ++layer) {
    const AttentionView a = chunked->build_sequence_view(0, layer), b = one_shot->build_sequence_view(0, layer);
    for (int h = 0; h < kHeads; ++h) {
      const KiviSeqView &ka = a.quantized.kivi_seqs[0], &kb = b.quantized.kivi_seqs[0];
      ASSERT_EQ(a.seqs[0].num_tokens[h], b.seqs[0].num_tokens[h]);
      ASSERT_EQ(ka.num_quantized_keys[h], kb.num_quantized_keys[h]);
      ASSERT_EQ(ka.num_quantized_values[h], kb.num_quantized_values[h]);
      auto page = [h](const AttentionView& view, int32_t group) {
        return static_cast<const char*>(view.kv_base) +
               static_cast<size_t>(view.seqs[0].page_ids[h * view.seqs[0].stride + group]) * view.page_bytes;
      };
      auto same = [](const char* x, const char* y, size_t n) { return std::equal(x, x + n, y); };
      for (int32_t g = 0; g < ka.num_quantized_keys[h] / kGroup; ++g)
        EXPECT_TRUE(same(page(a, g) + pl.key_codes, page(b, g) + pl.key_codes, key_code_bytes) &&
                    same(page(a, g) + pl.key_scale, page(b, g) + pl.key_scale, key_param_bytes))
            << "layer " << layer << " head " << h << " key group " << g;
      for (int32_t j = 0; j < ka.num_quantized_values[h]; ++j) {
        const size_t t = static_cast<size_t>(j % kGroup);
        const char *pa = page(a, j / kGroup), *pb = page(b, j / kGroup);
        EXPECT_TRUE(same(pa + pl.value_codes + t * value_code_bytes, pb + pl.value_codes + t * value_code_bytes,
                         value_code_bytes) &&
                    same(pa + pl.value_scale + t * value_param_bytes, pb + pl.value_scale + t * value_param_bytes,
                         value_param_bytes) &&
                    same(pa + pl.value_min + t * value_param_bytes, pb + pl.value_min + t * value_param_bytes,
                         value_param_bytes))
            << "layer " << layer << " head " << h << " value " << j;
      }
      const int32_t residual = a.seqs[0].num_tokens[h] - ka.num_quantized_values[h];
      for (int32_t t = 0; t < residual; ++t)
        for (int kv = 0; kv < 2; ++kv) {
          const int32_t sa = ka.residual_first_slot[h] + t, sb = kb.residual_first_slot[h] + t;
          const float* ra = a.element<const float>(ka.residual.page_ids[h * ka.residual.stride + sa / a.page_size], kv,
                                                   sa % a.page_size);
          const float* rb = b.element<const float>(kb.residual.page_ids[h * kb.residual.stride + sb / b.page_size], kv,
                                                   sb % b.page_size);
          ASSERT_TRUE(std::equal(ra, ra + kDim, rb)) << "layer " << layer << " head " << h << " token " << t;
        }
    }
  }
}

TEST_P(KiviKvStoreTest, OnlyTokensNothingQuantizedCanBeEvicted) {
  std::mt19937 rng(11);
  Rows rows = random_rows(rng, 100);
  // Without held prompts the window flushes as the prompt arrives: its quantized tokens cannot be dropped.
  auto cache = make_cache(GetParam());
  ASSERT_TRUE(cache->open(0, {}).is_ok());
  step(*cache, rows, 0, 100);
  const int64_t held = cache->num_held_pages(0);
  const std::vector<int32_t> kept = {0, 5, 99};
  EXPECT_FALSE(cache->can_evict_streams(0));
  const Status quantized = cache->evict(0, 0, 0, kept);
  EXPECT_EQ(quantized.code(), StatusCode::kFailedPrecondition) << quantized.to_string();
  EXPECT_EQ(cache->evict_slots(0, std::vector<KvStreams::SlotEviction>{{0, 0, 3}}).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(cache->num_held_pages(0), held);
  // A held prompt: kept indices out of order or past the stream, a stream listed twice, are refused unchanged.
  auto holding = make_cache(GetParam(), 4096, true);
  const std::vector<int32_t> prompt(40, 1);
  ASSERT_TRUE(holding->open(0, prompt).is_ok());
  write_step(*holding, rows, 0, 40);
  EXPECT_TRUE(holding->can_evict_streams(0));
  const int64_t before = holding->num_held_pages(0);
  EXPECT_EQ(holding->evict(0, 0, 0, {3, 2}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(holding->evict(0, 0, 0, {3, 40}).code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> some = {1, 2};
  const std::vector<KvStreams::StreamEviction> twice = {{1, 1, some}, {1, 1, some}};
  EXPECT_EQ(holding->evict_streams(0, twice).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(holding->num_held_pages(0), before);
  EXPECT_TRUE(holding->check_integrity().is_ok());
  // A snapshot of a held prompt carries the hold; the pool is whole once everything is closed.
  ASSERT_TRUE(holding->restore(1, holding->snapshot(0)).is_ok());
  EXPECT_EQ(holding->num_held_pages(1), before);
  ASSERT_TRUE(holding->evict(1, 0, 0, some).is_ok());
  holding->close(1);
  cache->close(0);
  EXPECT_EQ(holding->num_free_pages(), holding->num_total_pages());
  EXPECT_EQ(cache->num_free_pages(), cache->num_total_pages());
}

INSTANTIATE_TEST_SUITE_P(Bits, KiviKvStoreTest, ::testing::Values(KvStoreKind::kKivi2, KvStoreKind::kKivi4),
                         [](const auto& info) { return std::string(kv_store_kind_name(info.param)); });

TEST(KiviKvStoreLimitsTest, AShortPoolRefusesAStepAndChangesNothing) {
  auto cache = make_cache(KvStoreKind::kKivi4, 40);
  ASSERT_TRUE(cache->open(0, {}).is_ok());
  EXPECT_GT(cache->pages_to_reserve(0, 500), 40);
  EXPECT_FALSE(cache->reserve(0, 500).is_ok());
  EXPECT_EQ(cache->num_logical_tokens(0), 0);
  EXPECT_EQ(cache->num_free_pages(), 40);
  EXPECT_TRUE(cache->check_integrity().is_ok());
}

TEST(KiviKvStoreLimitsTest, TheLayoutCountsKiviBytes) {
  // 2 bits, head_dim 64, group 32: key codes 64 x 2 words, value codes 32 x 4 words, fp16 scale and minimum of 64
  // key groups and 32 x 2 value groups: 512 + 512 + 256 + 256 bytes; an f32 row pair is 512 bytes.
  const KvLayout l = kivi_layout(KvStoreKind::kKivi2);
  EXPECT_EQ(l.page_bytes(), 1536u);
  EXPECT_EQ(l.residual_page_tokens(), 3);
  // 640 tokens: 20 quantized key groups and a window of R = 64 explicit tokens.
  EXPECT_DOUBLE_EQ(l.bytes_per_token(640), (20.0 * 1536 + 64.0 * 512) / 640);
  EXPECT_DOUBLE_EQ(l.bytes_per_token(40), 512.0);  // all in the window
  // A stream of 640 tokens holds at most its 20 group pages and a window of R + one step, 264 tokens, from any slot.
  EXPECT_EQ(l.pages_per_stream(640), 20 + (264 + 4) / 3);
}

TEST(KiviKvStoreLimitsTest, TheLayoutRefusesGeometriesKiviCannotHold) {
  KvLayout l = kivi_layout(KvStoreKind::kKivi2);
  EXPECT_TRUE(l.validate().is_ok());
  l.kivi_residual = 48;  // not a multiple of the group
  EXPECT_FALSE(l.validate().is_ok());
  l = kivi_layout(KvStoreKind::kKivi2);
  l.page_size = 8;  // 2-bit codes pack 16 per word
  l.kivi_residual = 64;
  EXPECT_FALSE(l.validate().is_ok());
  l = kivi_layout(KvStoreKind::kKivi4);
  l.kivi_value_group_size = 24;  // does not divide head_dim
  EXPECT_FALSE(l.validate().is_ok());
  l = kivi_layout(KvStoreKind::kKivi4);
  l.kivi_max_step_tokens = 0;
  EXPECT_FALSE(l.validate().is_ok());
  EXPECT_FALSE(parse_kv_cache_dtype("kivi3").is_ok());
  EXPECT_EQ(*parse_kv_cache_dtype("kivi2"), KvStoreKind::kKivi2);
}

TEST(KiviKvStoreLimitsTest, OnlyVanillaAndTheSnapKvFamilyRunOverKivi) {
  const std::vector<std::pair<std::string, bool>> methods = {
      {"vanilla", true},       {"snapkv", true}, {"pyramidkv", true}, {"adakv", true},     {"chunkkv", true},
      {"streamingllm", false}, {"h2o", false},   {"kvzip", false},    {"shadowkv", false}, {"quest", false}};
  const bool cuda_kivi = cuda_implements(OpId::kPagedAttentionOverKiviPages);
  for (const auto& [name, runs] : methods) {
    auto method = create_method(name, nullptr);
    ASSERT_TRUE(method.is_ok()) << name;
    const Status cpu = check_kv_store_supports(KvStoreKind::kKivi2, Device::kCpu, (*method)->traits(), name);
    EXPECT_EQ(cpu.is_ok(), runs) << name << ": " << cpu.to_string();
    // A CUDA build has KIVI's kernels (its writes, attention and the window's attention_scores): the same methods
    // run. A CPU-only build refuses every method there, for the store's sake.
    const Status gpu = check_kv_store_supports(KvStoreKind::kKivi4, Device::kCuda, (*method)->traits(), name);
    if (cuda_kivi)
      EXPECT_EQ(gpu.is_ok(), runs) << name << ": " << gpu.to_string();
    else
      EXPECT_EQ(gpu.code(), StatusCode::kUnimplemented) << name << ": " << gpu.to_string();
  }
}

}  // namespace
}  // namespace se
