// The KIVI stores (--kv-cache-dtype kivi2 | kivi4) of KiviCacheManager: after every step, attention over the
// cache's view equals attention over the K/V the store must hold (keys of each whole R-token block quantized per
// channel in groups, values older than the last R tokens quantized per token, the rest exact), the quantizer being
// kivi_quant.h's, bit-exact against the numpy oracle of KIVI's new_pack.py (quantized_kv_test); a prompt written in
// chunks leaves the same store as one written at once; pages are counted exactly (pages_to_reserve, the layout's
// pages_per_stream, check_integrity) and all return to the pool; snapshots move the state; and the store refuses
// what it cannot hold. Under a compress-after method the store holds the prompt at full precision until it is
// computed, evicts from it per stream (streams may then differ in length), and quantizes the kept tokens only: the
// view is then KIVI over exactly the kept rows, chunked and one-shot prompts store the same, and evicting tokens
// that were quantized is refused but for whole sealed groups, which StreamingLLM drops as decode runs: the kept
// tokens are then the ones its rule over groups names, with the bytes a store that evicts nothing holds for them.
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

// Attention of q over K/V rows [len][dim] per head (head h's in k[h], v[h]), the query after every key.
Tensor attend_rows(const std::vector<std::vector<float>>& keys, const std::vector<std::vector<float>>& values,
                   const Tensor& q) {
  Tensor out = Tensor::zeros(DType::kF32, Shape{1, kHeads, kDim});
  for (int h = 0; h < kHeads; ++h) {
    const std::vector<float>& hk = keys[static_cast<size_t>(h)];
    const std::vector<float>& hv = values[static_cast<size_t>(h)];
    const auto len = static_cast<int64_t>(hk.size()) / kDim;
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

// Attention of q over the expected K/V of every stream of layer `layer`, head h's stream holding tokens[h].
Tensor attend_expected(Rows& rows, int layer, const std::vector<std::vector<int32_t>>& tokens, int bits,
                       const Tensor& q) {
  std::vector<std::vector<float>> keys(kHeads), values(kHeads);
  for (int h = 0; h < kHeads; ++h)
    expected_stream(rows, layer, h, tokens[static_cast<size_t>(h)], bits, keys[static_cast<size_t>(h)],
                    values[static_cast<size_t>(h)]);
  return attend_rows(keys, values, q);
}

Tensor attend_expected(Rows& rows, int layer, int64_t len, int bits, const Tensor& q) {
  return attend_expected(rows, layer, std::vector<std::vector<int32_t>>(kHeads, first_tokens(len)), bits, q);
}

std::unique_ptr<KiviCacheManager> make_cache(KvStoreKind store, int32_t num_pages = 4096, bool hold_prompts = false) {
  auto made = KiviCacheManager::create(kivi_layout(store), num_pages, cpu_allocator(), hold_prompts);
  SE_CHECK(made.is_ok(), "{}", made.status().to_string());
  return std::move(*made);
}

// Where the tokens of stream (layer, head h) of a KIVI view of one sequence lie.
struct StoredStream {
  const AttentionView& view;
  int h;
  int32_t keys() const { return view.quantized.kivi_seqs[0].num_quantized_keys[h]; }
  int32_t values() const { return view.quantized.kivi_seqs[0].num_quantized_values[h]; }
  int32_t num_tokens() const { return view.seqs[0].num_tokens[h]; }
  // The quantized page of slot j's group.
  const char* group_page(int32_t j) const {
    const SeqKvView& groups = view.seqs[0];
    return static_cast<const char*>(view.kv_base) +
           static_cast<size_t>(groups.page_ids[h * groups.stride + j / kGroup]) * view.page_bytes;
  }
  // Slot j's explicit K (kv 0) or V (kv 1) row in the window (j >= values()).
  const float* window_row(int32_t j, int kv) const {
    const KiviSeqView& kivi = view.quantized.kivi_seqs[0];
    const int32_t slot = kivi.residual_first_slot[h] + j - values();
    return view.element<const float>(kivi.residual.page_ids[h * kivi.residual.stride + slot / view.page_size], kv,
                                     slot % view.page_size);
  }
};

// Whether slot ja of stream a and slot jb of stream b hold the same bytes: the token's key (its group's codes and
// parameters, compared at the group's first slot, or its window row) and its value (its codes and parameters, or its
// window row).
::testing::AssertionResult same_token_bytes(const KiviPageLayout& pl, const StoredStream& a, int32_t ja,
                                            const StoredStream& b, int32_t jb) {
  auto same = [](const char* x, const char* y, size_t n) { return std::equal(x, x + n, y); };
  auto same_rows = [&](int kv) {
    const float *x = a.window_row(ja, kv), *y = b.window_row(jb, kv);
    return std::equal(x, x + kDim, y);
  };
  const size_t key_code_bytes = static_cast<size_t>(kDim) * static_cast<size_t>(pl.key_words) * sizeof(uint32_t);
  const size_t key_param_bytes = 2 * static_cast<size_t>(kDim) * sizeof(uint16_t);  // scales, then minima
  const size_t value_code_bytes = static_cast<size_t>(pl.value_words) * sizeof(uint32_t);
  const size_t value_param_bytes = static_cast<size_t>(pl.value_groups) * sizeof(uint16_t);
  if ((ja < a.keys()) != (jb < b.keys()) || (ja < a.values()) != (jb < b.values()))
    return ::testing::AssertionFailure() << "quantized in one store only";
  if (ja < a.keys()) {
    if (ja % kGroup != jb % kGroup) return ::testing::AssertionFailure() << "at different places in their groups";
    const char *pa = a.group_page(ja), *pb = b.group_page(jb);
    if (ja % kGroup == 0 && !(same(pa + pl.key_codes, pb + pl.key_codes, key_code_bytes) &&
                              same(pa + pl.key_scale, pb + pl.key_scale, key_param_bytes)))
      return ::testing::AssertionFailure() << "key group differs";
  } else if (!same_rows(0)) {
    return ::testing::AssertionFailure() << "key row differs";
  }
  if (ja < a.values()) {
    const size_t t = static_cast<size_t>(ja % kGroup);
    const char *pa = a.group_page(ja), *pb = b.group_page(jb);
    if (!(same(pa + pl.value_codes + t * value_code_bytes, pb + pl.value_codes + t * value_code_bytes,
               value_code_bytes) &&
          same(pa + pl.value_scale + t * value_param_bytes, pb + pl.value_scale + t * value_param_bytes,
               value_param_bytes) &&
          same(pa + pl.value_min + t * value_param_bytes, pb + pl.value_min + t * value_param_bytes,
               value_param_bytes)))
      return ::testing::AssertionFailure() << "quantized value differs";
  } else if (!same_rows(1)) {
    return ::testing::AssertionFailure() << "value row differs";
  }
  return ::testing::AssertionSuccess();
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
  for (int layer = 0; layer < kLayers; ++layer) {
    const AttentionView a = chunked->build_sequence_view(0, layer), b = one_shot->build_sequence_view(0, layer);
    for (int h = 0; h < kHeads; ++h) {
      const StoredStream sa{a, h}, sb{b, h};
      ASSERT_EQ(sa.num_tokens(), sb.num_tokens());
      ASSERT_EQ(sa.keys(), sb.keys());
      ASSERT_EQ(sa.values(), sb.values());
      for (int32_t j = 0; j < sa.num_tokens(); ++j)
        EXPECT_TRUE(same_token_bytes(chunked->page_layout(), sa, j, sb, j))
            << "layer " << layer << " head " << h << " token " << j;
    }
  }
}

// StreamingLLM's rule over KIVI groups as docs/fidelity.md states it, over positions: after a step, the oldest group
// past the sinks' goes when every position in it is older than the sequence's last budget - sinks and its values have
// left the window (its slots end R or more before the stream's end), then the next one.
void drop_groups_as_designed(std::vector<int32_t>& kept, int32_t num_tokens, int32_t budget, int32_t sinks) {
  const int32_t sink_groups = (sinks + kGroup - 1) / kGroup;
  const size_t first = static_cast<size_t>(sink_groups) * kGroup, end = first + kGroup;
  while (end + kResidual <= kept.size() && kept[end - 1] < num_tokens - (budget - sinks))
    kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(first), kept.begin() + static_cast<std::ptrdiff_t>(end));
}

// StreamingLLM over KIVI, through its finish_step, beside a KIVI store fed the same rows that evicts nothing: after
// every step of a chunked prompt and a long decode each stream holds exactly the positions the rule names, every kept
// token's bytes are the ones the store that evicts nothing holds for it (its key group's codes and parameters, its
// value's, or its window rows), attention over the view is attention over KIVI's quantization of the whole sequence
// at the kept positions, the pages stay within the method's peak, and the pool is whole after. The budget's recent
// tokens outnumber the window (they decide), or not (the window does).
TEST_P(KiviKvStoreTest, StreamingLlmDropsWholeSealedGroupsWithTheirBytes) {
  const KvStoreKind store = GetParam();
  const int bits = kivi_bits(store);
  const int32_t prompt = 150, total = 420;
  const std::vector<int32_t> next_turn = {40, 1, 63, 30};
  for (const auto& [budget, sinks] : {std::pair{100, 4}, std::pair{40, 0}, std::pair{70, 40}}) {
    std::mt19937 rng(static_cast<uint32_t>(20 + budget));
    Rows rows = random_rows(rng, total + std::accumulate(next_turn.begin(), next_turn.end(), 0));
    auto method = create_method("streamingllm", {{"budget", budget}, {"sink_tokens", sinks}});
    ASSERT_TRUE(method.is_ok()) << method.status().to_string();
    auto kept_all = make_cache(store), streaming = make_cache(store);
    ASSERT_TRUE(kept_all->open(0, {}).is_ok());
    ASSERT_TRUE(streaming->open(0, {}).is_ok());
    std::vector<std::vector<int32_t>> kept(kLayers * kHeads);
    int64_t dropped = 0;
    for (int32_t len = 0; len < total;) {
      const int32_t n = len < prompt ? std::min<int32_t>(prompt - len, 1 + static_cast<int32_t>(rng() % 60)) : 1;
      step(*kept_all, rows, len, n);
      write_step(*streaming, rows, len, n);
      EXPECT_LE(streaming->num_held_pages(0), (*method)->peak_pages(streaming->layout(), prompt, total - prompt));
      ForwardBatch batch;
      batch.sequences.push_back({0, 0, n});
      StepContext ctx{batch, *streaming, {}, {}};
      (*method)->finish_step(ctx);
      ASSERT_TRUE(streaming->check_integrity().is_ok()) << streaming->check_integrity().to_string();
      streaming->on_computed(0, {}, len + n);
      ASSERT_TRUE(streaming->check_integrity().is_ok()) << streaming->check_integrity().to_string();
      len += n;
      for (int layer = 0; layer < kLayers; ++layer) {
        const AttentionView a = streaming->build_sequence_view(0, layer), b = kept_all->build_sequence_view(0, layer);
        for (int h = 0; h < kHeads; ++h) {
          std::vector<int32_t>& want = kept[static_cast<size_t>(layer) * kHeads + static_cast<size_t>(h)];
          for (int32_t t = len - n; t < len; ++t) want.push_back(t);
          const size_t before = want.size();
          drop_groups_as_designed(want, len, budget, sinks);
          dropped += static_cast<int64_t>(before - want.size());
          const std::span<const int32_t> positions = streaming->slot_positions(0, layer, h);
          ASSERT_EQ(std::vector<int32_t>(positions.begin(), positions.end()), want) << "len " << len;
          const StoredStream sa{a, h}, sb{b, h};
          for (int32_t j = 0; j < sa.num_tokens(); ++j)
            ASSERT_TRUE(same_token_bytes(streaming->page_layout(), sa, j, sb, want[static_cast<size_t>(j)]))
                << "len " << len << " layer " << layer << " head " << h << " position " << want[static_cast<size_t>(j)];
        }
      }
      if (len % 23 != 0 && len != total) continue;
      for (int layer = 0; layer < kLayers; ++layer) {
        std::vector<std::vector<float>> keys(kHeads), values(kHeads);
        std::vector<float> k, v;
        for (int h = 0; h < kHeads; ++h) {
          expected_stream(rows, layer, h, first_tokens(len), bits, k, v);
          for (int32_t p : kept[static_cast<size_t>(layer) * kHeads + static_cast<size_t>(h)]) {
            keys[static_cast<size_t>(h)].insert(keys[static_cast<size_t>(h)].end(), k.begin() + p * kDim,
                                                k.begin() + (p + 1) * kDim);
            values[static_cast<size_t>(h)].insert(values[static_cast<size_t>(h)].end(), v.begin() + p * kDim,
                                                  v.begin() + (p + 1) * kDim);
          }
        }
        const Tensor q = random_query(rng);
        const Tensor got = attend(*streaming, layer, q), want = attend_rows(keys, values, q);
        for (int64_t i = 0; i < got.numel(); ++i)
          ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-4f) << "len " << len << " layer " << layer;
      }
    }
    // Groups went, and each stream holds at most a group less one past its sinks' groups and the larger of its
    // recent tokens and the window.
    EXPECT_GT(dropped, 0);
    const int32_t most = (sinks + kGroup - 1) / kGroup * kGroup + std::max(budget - sinks, kResidual) + kGroup - 1;
    for (const std::vector<int32_t>& stream : kept) EXPECT_LE(static_cast<int32_t>(stream.size()), most);
    // A chain's next turn from here, appended before anything drops: its steps stay within what the snapshot said
    // its streams may grow by, counted from where the dropped groups left each window.
    std::unique_ptr<SequenceSnapshot> snap = streaming->snapshot(0);
    const int64_t held = snap->num_held_pages();
    const int64_t extension =
        snap->num_pages_to_extend(std::accumulate(next_turn.begin(), next_turn.end(), 0)).value_or(0);
    ASSERT_TRUE(streaming->restore(0, std::move(snap)).is_ok());
    int64_t begin = total;
    for (int32_t n : next_turn) {
      write_step(*streaming, rows, begin, n);
      EXPECT_LE(streaming->num_held_pages(0) - held, extension) << "budget " << budget << " at " << begin;
      begin += n;
      streaming->on_computed(0, {}, static_cast<int32_t>(begin));
      ASSERT_TRUE(streaming->check_integrity().is_ok()) << streaming->check_integrity().to_string();
    }
    streaming->close(0);
    kept_all->close(0);
    EXPECT_EQ(streaming->num_free_pages(), streaming->num_total_pages());
    EXPECT_TRUE(streaming->check_integrity().is_ok());
  }
}

TEST_P(KiviKvStoreTest, QuantizedTokensLeaveOnlyAsWholeSealedGroups) {
  std::mt19937 rng(11);
  Rows rows = random_rows(rng, 100);
  // Without held prompts the window flushes as the prompt arrives: of 100 tokens (R = 64) the keys of two groups
  // and the values of 36 tokens are quantized, so one group is sealed. Single tokens, part of a group, or a group
  // whose values are partly in the window cannot be dropped.
  auto cache = make_cache(GetParam());
  ASSERT_TRUE(cache->open(0, {}).is_ok());
  step(*cache, rows, 0, 100);
  const int64_t held = cache->num_held_pages(0);
  EXPECT_FALSE(cache->can_evict_streams(0));
  EXPECT_EQ(cache->sealed_groups(0, 1, 1).group_size, kGroup);
  EXPECT_EQ(cache->sealed_groups(0, 1, 1).count, 1);
  auto slots = [](int32_t begin, int32_t end) {
    std::vector<int32_t> kept(static_cast<size_t>(end - begin));
    std::iota(kept.begin(), kept.end(), begin);
    return kept;
  };
  std::vector<int32_t> unsealed = slots(0, 32), part = slots(16, 100);
  const std::vector<int32_t> tail = slots(64, 100);
  unsealed.insert(unsealed.end(), tail.begin(), tail.end());
  for (const std::vector<int32_t>& kept : {std::vector<int32_t>{0, 5, 99}, unsealed, part}) {
    const Status refused = cache->evict(0, 1, 1, kept);
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  }
  EXPECT_EQ(cache->evict_slots(0, std::vector<KvStreams::SlotEviction>{{0, 0, 3}}).code(), StatusCode::kUnimplemented);
  EXPECT_EQ(cache->num_held_pages(0), held);
  // The sealed group goes as its page; the stream's other tokens keep their positions.
  ASSERT_TRUE(cache->evict(0, 1, 1, slots(32, 100)).is_ok());
  EXPECT_EQ(cache->num_held_pages(0), held - 1);
  const std::span<const int32_t> positions = cache->slot_positions(0, 1, 1);
  EXPECT_EQ(std::vector<int32_t>(positions.begin(), positions.end()), slots(32, 100));
  EXPECT_EQ(cache->sealed_groups(0, 1, 1).count, 0);
  EXPECT_TRUE(cache->check_integrity().is_ok()) << cache->check_integrity().to_string();
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

TEST_P(KiviKvStoreTest, EvictingNoStreamLeavesTheStepsFlushToTheStep) {
  std::mt19937 rng(12);
  Rows rows = random_rows(rng, 100);
  // The forward of 100 tokens is written, not reported: its flush (two key groups, 36 tokens' values, the window
  // pages they leave) is pending until on_computed. An eviction that lists no stream runs none of it.
  auto cache = make_cache(GetParam());
  ASSERT_TRUE(cache->open(0, {}).is_ok());
  write_step(*cache, rows, 0, 100);
  const int64_t held = cache->num_held_pages(0);
  ASSERT_TRUE(cache->evict_streams(0, {}).is_ok());
  EXPECT_EQ(cache->num_held_pages(0), held);
  cache->on_computed(0, {}, 100);
  EXPECT_LT(cache->num_held_pages(0), held);
  EXPECT_TRUE(cache->check_integrity().is_ok()) << cache->check_integrity().to_string();
  cache->close(0);
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

// Quest runs over KIVI on the CPU only (its page bounds and selection read whole groups there).
TEST(KiviKvStoreLimitsTest, VanillaTheSnapKvFamilyStreamingLlmH2oAndQuestRunOverKivi) {
  struct Expected {
    std::string name;
    bool on_cpu, on_cuda;
  };
  const std::vector<Expected> methods = {
      {"vanilla", true, true},    {"snapkv", true, true},       {"pyramidkv", true, true}, {"adakv", true, true},
      {"chunkkv", true, true},    {"streamingllm", true, true}, {"h2o", true, false},      {"kvzip", false, false},
      {"shadowkv", false, false}, {"omnikv", false, false},     {"quest", true, false}};
  const bool cuda_kivi = cuda_implements(OpId::kPagedAttentionOverKiviPages);
  for (const auto& [name, on_cpu, on_cuda] : methods) {
    auto method = create_method(name, nullptr);
    ASSERT_TRUE(method.is_ok()) << name;
    const Status cpu = check_kv_store_supports(KvStoreKind::kKivi2, Device::kCpu, (*method)->traits(), name);
    EXPECT_EQ(cpu.is_ok(), on_cpu) << name << ": " << cpu.to_string();
    // A CUDA build has KIVI's kernels (its writes, attention and the window's attention_scores; StreamingLLM's
    // dropped groups move no byte): the same methods run but Quest and H2O, whose ops read quantized groups on the
    // CPU only. A CPU-only build refuses every method there, for the store's sake.
    const Status gpu = check_kv_store_supports(KvStoreKind::kKivi4, Device::kCuda, (*method)->traits(), name);
    if (cuda_kivi)
      EXPECT_EQ(gpu.is_ok(), on_cuda) << name << ": " << gpu.to_string();
    else
      EXPECT_EQ(gpu.code(), StatusCode::kUnimplemented) << name << ": " << gpu.to_string();
  }
}

}  // namespace
}  // namespace se
