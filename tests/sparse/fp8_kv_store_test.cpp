// The FP8 store of the paged cache: what write() puts in the pages (e4m3 codes of x / scale, with per-(layer,
// KV head) scales fixed by the first batch each layer sees), that eviction and snapshots move those codes as
// they are, that attention over the cache's view equals attention over the dequantized K/V, and which methods
// and devices the store admits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../support/kv_store_steps.h"
#include "backend/ops.h"
#include "backend/quant/fp8_kv.h"
#include "sparse/method_registry.h"
#include "sparse/paged_cache_manager.h"

namespace se {
namespace {

using test::write_step;

constexpr int kLayers = 2, kHeads = 2, kDim = 8, kPageSize = 4;

KvLayout fp8_layout() {
  KvLayout l{
      kLayers, kHeads, kDim, kPageSize, kv_page_dtype(Device::kCpu, KvStoreKind::kFp8E4M3), KvStoreKind::kFp8E4M3};
  return l;
}

Tensor random_rows(std::mt19937& rng, int64_t rows, float amplitude) {
  return test::random_kv_rows(rng, rows, kHeads, kDim, amplitude);
}

// max|x| over KV head h's rows of x [T, Hkv, D] divided by `divisor`: vLLM's calculate_kv_scales per head.
float head_scale(const Tensor& x, int h, float divisor) {
  float m = 0.0f;
  for (int64_t r = 0; r < x.shape()[0]; ++r)
    for (int d = 0; d < kDim; ++d) m = std::max(m, std::fabs(x.data<float>()[(r * kHeads + h) * kDim + d]));
  return m / divisor;
}

// The code the store must hold for element d of row r of x, under `scale`.
uint8_t expected_code(const Tensor& x, int64_t r, int h, int d, float scale) {
  uint8_t code = 0;
  fp8_quantize(x.data<float>() + (r * kHeads + h) * kDim + d, 1, scale, Fp8Format::kE4M3, &code);
  return code;
}

TEST(Fp8KvStoreTest, WritesCodesUnderScalesFixedByTheFirstBatch) {
  auto made = PagedCacheManager::create(fp8_layout(), 64, cpu_allocator(), false);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  PagedCacheManager& cache = **made;
  EXPECT_EQ(cache.layout().page_bytes(), size_t{2} * kPageSize * kDim);  // one byte per element
  std::mt19937 rng(3);
  ASSERT_TRUE(cache.open(0, {}).is_ok());
  ASSERT_TRUE(cache.reserve(0, 6).is_ok());
  const Tensor k1 = random_rows(rng, 6, 1.0f), v1 = random_rows(rng, 6, 0.5f);
  write_step(cache, 1, 6, k1, v1);
  // A second chunk four times larger: the scales stay those of the first, so its codes saturate at 448 * scale.
  ASSERT_TRUE(cache.reserve(0, 3).is_ok());
  const Tensor k2 = random_rows(rng, 3, 4.0f), v2 = random_rows(rng, 3, 2.0f);
  write_step(cache, 1, 3, k2, v2);

  const AttentionView view = cache.build_sequence_view(0, 1);
  ASSERT_EQ(view.payload, KvPayload::kQuantized);
  ASSERT_EQ(view.quantized.scheme, KvQuantScheme::kFp8E4M3);
  ASSERT_EQ(view.kv_dtype, DType::kU8);
  for (int h = 0; h < kHeads; ++h) {
    const float ks = head_scale(k1, h, kFp8KeyScaleDivisor), vs = head_scale(v1, h, kFp8ValueScaleDivisor);
    EXPECT_EQ(view.quantized.k_scales[h], ks);
    EXPECT_EQ(view.quantized.v_scales[h], vs);
    for (int32_t t = 0; t < 9; ++t) {
      const Tensor& k = t < 6 ? k1 : k2;
      const Tensor& v = t < 6 ? v1 : v2;
      const int64_t r = t < 6 ? t : t - 6;
      const PageSlot at = cache.table(0)->slot(1, h, t);
      for (int d = 0; d < kDim; ++d) {
        ASSERT_EQ(view.element<uint8_t>(at.page_id, 0, at.offset)[d], expected_code(k, r, h, d, ks)) << t;
        ASSERT_EQ(view.element<uint8_t>(at.page_id, 1, at.offset)[d], expected_code(v, r, h, d, vs)) << t;
      }
    }
  }
  // Layer 0 has seen nothing yet: its scales are still open, and its first batch sets them.
  const AttentionView layer0 = cache.build_sequence_view(0, 0);
  EXPECT_EQ(layer0.quantized.k_scales[0], 1.0f);
  cache.close(0);
  EXPECT_TRUE(cache.check_integrity().is_ok());
  EXPECT_EQ(cache.num_free_pages(), cache.num_total_pages());
}

// A checkpoint's scales (vLLM's k_scale / v_scale) replace the calibration: the first batch's rows are written
// under them, and scales that do not fit the layout, or a store other than FP8, are refused.
TEST(Fp8KvStoreTest, WritesCodesUnderTheCheckpointsScales) {
  KvCacheScales scales;
  scales.num_kv_heads = kHeads;
  scales.k = {0.01f, 0.02f, 0.03f, 0.04f};  // [layer][head]
  scales.v = {0.05f, 0.06f, 0.07f, 0.08f};
  auto made = PagedCacheManager::create(fp8_layout(), 64, cpu_allocator(), false, 0, nullptr, &scales);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  PagedCacheManager& cache = **made;
  std::mt19937 rng(5);
  ASSERT_TRUE(cache.open(0, {}).is_ok());
  ASSERT_TRUE(cache.reserve(0, 5).is_ok());
  const Tensor k = random_rows(rng, 5, 1.0f), v = random_rows(rng, 5, 0.5f);
  write_step(cache, 1, 5, k, v);
  const AttentionView view = cache.build_sequence_view(0, 1);
  for (int h = 0; h < kHeads; ++h) {
    const float ks = scales.k[static_cast<size_t>(kHeads) + static_cast<size_t>(h)],
                vs = scales.v[static_cast<size_t>(kHeads) + static_cast<size_t>(h)];
    EXPECT_EQ(view.quantized.k_scales[h], ks);
    EXPECT_EQ(view.quantized.v_scales[h], vs);
    for (int32_t t = 0; t < 5; ++t) {
      const PageSlot at = cache.table(0)->slot(1, h, t);
      for (int d = 0; d < kDim; ++d) {
        ASSERT_EQ(view.element<uint8_t>(at.page_id, 0, at.offset)[d], expected_code(k, t, h, d, ks)) << t;
        ASSERT_EQ(view.element<uint8_t>(at.page_id, 1, at.offset)[d], expected_code(v, t, h, d, vs)) << t;
      }
    }
  }
  KvCacheScales one_head = scales.heads(0, 1);
  EXPECT_EQ(one_head.k, (std::vector<float>{0.01f, 0.03f}));
  EXPECT_EQ(PagedCacheManager::create(fp8_layout(), 64, cpu_allocator(), false, 0, nullptr, &one_head).status().code(),
            StatusCode::kInvalidArgument);
  KvLayout explicit_layout = fp8_layout();
  explicit_layout.store = KvStoreKind::kExplicit;
  explicit_layout.dtype = DType::kF32;
  EXPECT_EQ(PagedCacheManager::create(explicit_layout, 64, cpu_allocator(), false, 0, nullptr, &scales).status().code(),
            StatusCode::kInvalidArgument);
}

// Eviction copies codes: the kept tokens' bytes land in their new slots unchanged.
TEST(Fp8KvStoreTest, EvictionAndSnapshotsMoveCodesAsTheyAre) {
  auto made = PagedCacheManager::create(fp8_layout(), 64, cpu_allocator(), false);
  ASSERT_TRUE(made.is_ok());
  PagedCacheManager& cache = **made;
  std::mt19937 rng(4);
  ASSERT_TRUE(cache.open(0, {}).is_ok());
  ASSERT_TRUE(cache.reserve(0, 10).is_ok());
  for (int layer = 0; layer < kLayers; ++layer)
    write_step(cache, layer, 10, random_rows(rng, 10, 1.0f), random_rows(rng, 10, 1.0f));
  const auto row_bytes = [&](int32_t seq, int h, int32_t t, int kv) {
    const AttentionView view = cache.build_sequence_view(seq, 1);
    const PageSlot at = cache.table(seq)->slot(1, h, t);
    const uint8_t* row = view.element<uint8_t>(at.page_id, kv, at.offset);
    return std::vector<uint8_t>(row, row + kDim);
  };
  const std::vector<int32_t> kept = {0, 3, 7, 9};
  std::vector<std::vector<uint8_t>> before(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) before[i] = row_bytes(0, 1, kept[i], 1);
  const std::vector<uint8_t> moved_key = row_bytes(0, 0, 9, 0);
  ASSERT_TRUE(cache.evict(0, 1, 1, kept).is_ok());
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(row_bytes(0, 1, static_cast<int32_t>(i), 1), before[i]);
  const std::vector<CacheManager::SlotEviction> one = {{1, 0, 2}};
  ASSERT_TRUE(cache.evict_slots(0, one).is_ok());
  EXPECT_EQ(row_bytes(0, 0, 2, 0), moved_key);  // the last token refilled slot 2
  ASSERT_TRUE(cache.restore(5, cache.snapshot(0)).is_ok());
  EXPECT_EQ(row_bytes(5, 1, 3, 1), before[3]);
  cache.close(5);
  EXPECT_TRUE(cache.check_integrity().is_ok());
  EXPECT_EQ(cache.num_free_pages(), cache.num_total_pages());
}

// paged_attention over the cache's FP8 view is attention over the K/V the codes decode to: nothing but the
// rounding of the store separates it from the reference.
TEST(Fp8KvStoreTest, AttentionOverTheStoreEqualsAttentionOverDecodedKv) {
  auto made = PagedCacheManager::create(fp8_layout(), 64, cpu_allocator(), false);
  ASSERT_TRUE(made.is_ok());
  PagedCacheManager& cache = **made;
  std::mt19937 rng(5);
  constexpr int32_t kTokens = 11, kQueryHeads = 4;
  ASSERT_TRUE(cache.open(0, {}).is_ok());
  ASSERT_TRUE(cache.reserve(0, kTokens).is_ok());
  const Tensor k = random_rows(rng, kTokens, 1.0f), v = random_rows(rng, kTokens, 1.0f);
  ForwardBatch batch;
  batch.sequences.push_back({0, 0, kTokens});
  const AttentionView view = cache.build_view(0, batch);
  cache.write(0, view, k.view(), v.view());

  Tensor q = Tensor::empty(DType::kF32, Shape{kTokens, kQueryHeads, kDim}, cpu_allocator());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = normal(rng);
  Tensor decoded_k = Tensor::empty(DType::kF32, k.shape(), cpu_allocator());
  Tensor decoded_v = Tensor::empty(DType::kF32, v.shape(), cpu_allocator());
  Tensor positions = Tensor::empty(DType::kI32, Shape{kTokens}, cpu_allocator());
  for (int32_t t = 0; t < kTokens; ++t) {
    positions.data<int32_t>()[t] = t;
    for (int h = 0; h < kHeads; ++h) {
      const PageSlot at = cache.table(0)->slot(0, h, t);
      const int64_t row = (int64_t{t} * kHeads + h) * kDim;
      fp8_dequantize(view.element<uint8_t>(at.page_id, 0, at.offset), kDim, view.quantized.k_scales[h],
                     Fp8Format::kE4M3, decoded_k.data<float>() + row);
      fp8_dequantize(view.element<uint8_t>(at.page_id, 1, at.offset), kDim, view.quantized.v_scales[h],
                     Fp8Format::kE4M3, decoded_v.data<float>() + row);
    }
  }
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  Tensor got = Tensor::empty(DType::kF32, q.shape(), cpu_allocator());
  Tensor want = Tensor::empty(DType::kF32, q.shape(), cpu_allocator());
  paged_attention(got.view(), q.view(), view, params);
  attention(want.view(), q.view(), decoded_k.view(), decoded_v.view(), positions.view(), positions.view(), params);
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f) << i;
  cache.close(0);
}

// attention_scores over the FP8 view (what SnapKV and H2O rank by) equals attention_scores over an f32 cache that
// holds the K/V the codes decode to.
TEST(Fp8KvStoreTest, AttentionScoresReadTheDecodedKeys) {
  auto fp8_made = PagedCacheManager::create(fp8_layout(), 64, cpu_allocator(), false);
  KvLayout f32_layout = fp8_layout();
  f32_layout.store = KvStoreKind::kExplicit;
  f32_layout.dtype = DType::kF32;
  auto f32_made = PagedCacheManager::create(f32_layout, 64, cpu_allocator(), false);
  ASSERT_TRUE(fp8_made.is_ok() && f32_made.is_ok());
  PagedCacheManager& fp8 = **fp8_made;
  PagedCacheManager& f32 = **f32_made;
  std::mt19937 rng(6);
  constexpr int32_t kTokens = 13, kQueryHeads = 4, kRows = 3;
  ASSERT_TRUE(fp8.open(0, {}).is_ok() && f32.open(0, {}).is_ok());
  ASSERT_TRUE(fp8.reserve(0, kTokens).is_ok() && f32.reserve(0, kTokens).is_ok());
  const Tensor k = random_rows(rng, kTokens, 1.0f), v = random_rows(rng, kTokens, 1.0f);
  write_step(fp8, 0, kTokens, k, v);
  // The decoded rows, written into the f32 cache.
  const AttentionView fp8_view = fp8.build_sequence_view(0, 0);
  Tensor decoded_k = Tensor::empty(DType::kF32, k.shape(), cpu_allocator());
  for (int32_t t = 0; t < kTokens; ++t)
    for (int h = 0; h < kHeads; ++h) {
      const PageSlot at = fp8.table(0)->slot(0, h, t);
      fp8_dequantize(fp8_view.element<uint8_t>(at.page_id, 0, at.offset), kDim, fp8_view.quantized.k_scales[h],
                     Fp8Format::kE4M3, decoded_k.data<float>() + (int64_t{t} * kHeads + h) * kDim);
    }
  write_step(f32, 0, kTokens, decoded_k, v);

  Tensor q = Tensor::empty(DType::kF32, Shape{kRows, kQueryHeads, kDim}, cpu_allocator());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<float>()[i] = normal(rng);
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  Tensor got = Tensor::empty(DType::kF32, Shape{kQueryHeads, kTokens}, cpu_allocator());
  Tensor want = Tensor::empty(DType::kF32, Shape{kQueryHeads, kTokens}, cpu_allocator());
  attention_scores(got.view(), q.view(), fp8.build_sequence_view(0, 0), 0, params, ScoreReduce::kSum);
  attention_scores(want.view(), q.view(), f32.build_sequence_view(0, 0), 0, params, ScoreReduce::kSum);
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-6f) << i;
  fp8.close(0);
  f32.close(0);
}

// The store admits vanilla, the methods whose K/V ops all read it (eviction's row copies, attention_scores) and, on
// the CPU, Quest's page bounds and selection; key gathering and KVzip's subset scores read explicit pages, so those
// are refused with the reason. On CUDA (in a build with it) the eviction methods run over it, and Quest is refused as
// its ops read FP8 pages on the CPU only.
TEST(Fp8KvStoreTest, SupportedMethodsAndDevices) {
  const auto check = [](const char* name, Device device) {
    auto method = create_method(name, nullptr);
    SE_CHECK(method.is_ok(), "{}", name);
    return check_kv_store_supports(KvStoreKind::kFp8E4M3, device, (*method)->traits(), name);
  };
  EXPECT_TRUE(check("vanilla", Device::kCpu).is_ok());
  EXPECT_TRUE(check("streamingllm", Device::kCpu).is_ok());
  EXPECT_TRUE(check("snapkv", Device::kCpu).is_ok());
  EXPECT_TRUE(check("h2o", Device::kCpu).is_ok());
  EXPECT_TRUE(check("quest", Device::kCpu).is_ok());
  EXPECT_EQ(check("omnikv", Device::kCpu).code(), StatusCode::kInvalidArgument);  // top_keys_by_logits_max_over_heads
  EXPECT_EQ(check("rkv", Device::kCpu).code(), StatusCode::kInvalidArgument);     // gather_keys
  EXPECT_EQ(check("kvzip", Device::kCpu).code(), StatusCode::kInvalidArgument);   // subset_attention_max_scores
  const bool cuda_fp8 = cuda_implements(OpId::kPagedAttentionOverFp8Pages);
  for (const char* name : {"vanilla", "streamingllm", "snapkv", "h2o"})
    EXPECT_EQ(check(name, Device::kCuda).is_ok(), cuda_fp8) << name;
  const Status quest_on_cuda = check("quest", Device::kCuda);
  EXPECT_EQ(quest_on_cuda.code(), cuda_fp8 ? StatusCode::kInvalidArgument : StatusCode::kUnimplemented);
  EXPECT_NE(quest_on_cuda.message().find("CPU only"), std::string::npos) << quest_on_cuda.message();
  auto vanilla = create_method("vanilla", nullptr);
  ASSERT_TRUE(vanilla.is_ok());
  EXPECT_TRUE(check_kv_store_supports(KvStoreKind::kExplicit, Device::kCuda, (*vanilla)->traits(), "vanilla").is_ok());
  EXPECT_EQ(parse_kv_cache_dtype("fp8").value(), KvStoreKind::kFp8E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3").value(), KvStoreKind::kFp8E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("auto").value(), KvStoreKind::kExplicit);
  EXPECT_EQ(parse_kv_cache_dtype("int3").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace se
