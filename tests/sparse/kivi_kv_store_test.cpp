// The KIVI stores (--kv-cache-dtype kivi2 | kivi4) of KiviCacheManager: after every step, attention over the
// cache's view equals attention over the K/V the store must hold (keys of each whole R-token block quantized per
// channel in groups, values older than the last R tokens quantized per token, the rest exact), the quantizer being
// kivi_quant.h's, bit-exact against the numpy oracle of KIVI's new_pack.py (quantized_kv_test); a prompt written in
// chunks leaves the same store as one written at once; pages are counted exactly (pages_to_reserve, the layout's
// pages_per_stream, check_integrity) and all return to the pool; snapshots move the state; and the store refuses
// what it cannot hold.
#include <gtest/gtest.h>

#include <cmath>
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

// Appends tokens [begin, begin + n) of `rows` to sequence 0 as one step: reserve, every layer's write, on_computed.
void step(KiviCacheManager& cache, Rows& rows, int64_t begin, int32_t n) {
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
  cache.on_computed(0, {}, 0);
  ASSERT_TRUE(cache.check_integrity().is_ok()) << cache.check_integrity().to_string();
}

// What the store holds for `len` tokens of one stream: [len][dim] keys and values, quantized as KIVI quantizes them.
void expected_stream(Rows& rows, int layer, int h, int64_t len, int bits, std::vector<float>& k,
                     std::vector<float>& v) {
  k.assign(static_cast<size_t>(len * kDim), 0.0f);
  v.assign(k.size(), 0.0f);
  for (int64_t t = 0; t < len; ++t) {
    std::copy_n(rows.at(rows.k, t, layer, h), kDim, &k[static_cast<size_t>(t * kDim)]);
    std::copy_n(rows.at(rows.v, t, layer, h), kDim, &v[static_cast<size_t>(t * kDim)]);
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

// Attention of q over the expected K/V of every stream of layer `layer`.
Tensor attend_expected(Rows& rows, int layer, int64_t len, int bits, const Tensor& q) {
  Tensor k = Tensor::empty(DType::kF32, Shape{len, kHeads, kDim});
  Tensor v = Tensor::empty(DType::kF32, Shape{len, kHeads, kDim});
  std::vector<float> hk, hv;
  for (int h = 0; h < kHeads; ++h) {
    expected_stream(rows, layer, h, len, bits, hk, hv);
    for (int64_t t = 0; t < len; ++t) {
      std::copy_n(&hk[static_cast<size_t>(t * kDim)], kDim, k.data<float>() + (t * kHeads + h) * kDim);
      std::copy_n(&hv[static_cast<size_t>(t * kDim)], kDim, v.data<float>() + (t * kHeads + h) * kDim);
    }
  }
  Tensor q_pos = Tensor::empty(DType::kI32, Shape{1});
  Tensor k_pos = Tensor::empty(DType::kI32, Shape{len});
  q_pos.data<int32_t>()[0] = static_cast<int32_t>(len - 1);
  for (int64_t t = 0; t < len; ++t) k_pos.data<int32_t>()[t] = static_cast<int32_t>(t);
  Tensor out = Tensor::zeros(DType::kF32, Shape{1, kHeads, kDim});
  attention(out.view(), q.view(), k.view(), v.view(), q_pos.view(), k_pos.view(),
            AttentionParams{1.0f / std::sqrt(float{kDim})});
  return out;
}

std::unique_ptr<KiviCacheManager> make_cache(KvStoreKind store, int32_t num_pages = 4096) {
  auto made = KiviCacheManager::create(kivi_layout(store), num_pages, cpu_allocator());
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

TEST(KiviKvStoreLimitsTest, OnlyMethodsWithoutOpsRunOverKivi) {
  for (const char* name : {"vanilla", "snapkv", "streamingllm", "quest"}) {
    auto method = create_method(name, nullptr);
    ASSERT_TRUE(method.is_ok()) << name;
    const Status cpu = check_kv_store_supports(KvStoreKind::kKivi2, Device::kCpu, (*method)->traits(), name);
    EXPECT_EQ(cpu.is_ok(), (*method)->traits().ops.empty()) << name << ": " << cpu.to_string();
    EXPECT_FALSE(check_kv_store_supports(KvStoreKind::kKivi4, Device::kCuda, (*method)->traits(), name).is_ok());
  }
}

}  // namespace
}  // namespace se
