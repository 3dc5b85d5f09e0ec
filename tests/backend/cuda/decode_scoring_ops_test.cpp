// Parity of the decode-time compression ops' CUDA twins with their CPU twins (the ops the CPU path of rkv and
// kara runs): gather_keys over the cache's host tables and the device pool copies the same bf16 keys exactly
// (page sizes 16 and 64, per-head stream lengths, ranges that start and end inside pages); the three scores over
// the same f32 queries and keys agree to 1e-5 (the device's dot products are f32, the CPU's double; both reduce them
// in double), GQA groups 1, 2, 4 and 8, head_dim 64, 80 and 128, windows of a few rows up to budget + buffer keys;
// key_redundancy also with repeated keys, whose newest copies go unpenalized; redundancy_aware_scores on random
// importance and redundancy, kernels 1 and 7.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "paged_cache_fixture.h"

namespace se {
namespace {

using test::PagedCacheFixture;
using test::PagedCase;
using test::poisoned;
using test::random_host;
using test::upload;

TEST(CudaDecodeScoringOpsTest, GatherKeysCopiesTheDeviceKeysExactly) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<PagedCase> cases = {
      {"ps16 d128", 16, 8, 4, 128, {{1200, 1}, {37, 1}}, 0, 0.0f, 3},
      {"ps64 d64", 64, 2, 8, 64, {{700, 1}, {64, 1}}},
  };
  uint64_t seed = 12000;
  for (const PagedCase& c : cases) {
    SCOPED_TRACE(c.name);
    PagedCacheFixture cache(c, seed += 10);
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      const int32_t len = cache.shortest_stream(s);
      for (const auto& [first, n] : std::vector<std::pair<int32_t, int32_t>>{{0, len}, {len / 3, len / 2}, {5, 1}}) {
        if (n <= 0 || first + n > len) continue;
        Tensor ref = Tensor::empty(DType::kF32, {n, c.num_kv_heads, c.head_dim});
        gather_keys(ref.view(), cache.cpu_view(), static_cast<int32_t>(s), first);
        Tensor got = poisoned(DType::kF32, {n, c.num_kv_heads, c.head_dim});
        gather_keys(got.view(), cache.host_tables_gpu_view(), static_cast<int32_t>(s), first);
        const Tensor host = test::download_f32(got);
        int64_t mismatches = 0;
        for (int64_t i = 0; i < ref.numel(); ++i) mismatches += host.data<float>()[i] != ref.data<float>()[i];
        EXPECT_EQ(mismatches, 0) << "seq " << s << " slots [" << first << ", " << first + n << ")";
      }
    }
  }
}

struct ScoreCase {
  const char* name;
  int32_t rows, num_kv_heads, group, head_dim, num_keys;
};

const std::vector<ScoreCase> kScoreCases = {
    {"w8 g4 d128 T1152", 8, 8, 4, 128, 1152},    // R-KV at budget 1024 + buffer 128 (Llama-3.1-8B shape)
    {"w576 g4 d128 n512", 576, 8, 4, 128, 512},  // Kara's default window of 512 + 64 queries
    {"w3 g1 d64 n5", 3, 2, 1, 64, 5},           {"w16 g8 d64 n300", 16, 1, 8, 64, 300},
    {"w5 g2 d80 n129", 5, 2, 2, 80, 129},
};

// Runs op(out, queries, keys) on both devices; the relative error of the device result.
template <typename Op>
double window_score_error(const ScoreCase& c, uint64_t seed, Op op) {
  const int64_t heads = int64_t{c.num_kv_heads} * c.group;
  const Tensor q = random_host({c.rows, heads, c.head_dim}, seed, DType::kF32);
  const Tensor k = random_host({c.num_keys, c.num_kv_heads, c.head_dim}, seed + 1, DType::kF32);
  Tensor ref = Tensor::empty(DType::kF32, {c.num_kv_heads, c.num_keys});
  op(ref.view(), q.view(), k.view());
  const Tensor q_dev = upload(q, DType::kF32), k_dev = upload(k, DType::kF32);
  Tensor got = poisoned(DType::kF32, {c.num_kv_heads, c.num_keys});
  op(got.view(), q_dev.view(), k_dev.view());
  return test::relative_error(test::download_f32(got), ref);
}

TEST(CudaDecodeScoringOpsTest, WindowScoresMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 12100;
  for (const ScoreCase& c : kScoreCases) {
    const double bidirectional = window_score_error(
        c, seed += 10, [](TensorView out, TensorView q, TensorView k) { bidirectional_window_scores(out, q, k); });
    const double group_max = window_score_error(
        c, seed += 10, [](TensorView out, TensorView q, TensorView k) { group_max_attention_importance(out, q, k); });
    std::printf("PARITY decode window scores %-20s bidirectional %.3e group-max %.3e\n", c.name, bidirectional,
                group_max);
    EXPECT_LT(bidirectional, 1e-5) << c.name;
    EXPECT_LT(group_max, 1e-5) << c.name;
  }
}

TEST(CudaDecodeScoringOpsTest, KeyRedundancyMatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 12300;
  for (const ScoreCase& c : kScoreCases) {
    Tensor k = random_host({c.num_keys, c.num_kv_heads, c.head_dim}, seed += 10, DType::kF32);
    // Some keys repeat an earlier one (in every KV head): near-duplicates above the threshold.
    const int64_t row = int64_t{c.num_kv_heads} * c.head_dim;
    for (int32_t t = 7; t < c.num_keys; t += 11)
      std::copy_n(k.data<float>() + (t / 3) * row, row, k.data<float>() + int64_t{t} * row);
    Tensor ref = Tensor::empty(DType::kF32, {c.num_kv_heads, c.num_keys});
    key_redundancy(ref.view(), k.view(), 0.5f);
    const Tensor k_dev = upload(k, DType::kF32);
    Tensor got = poisoned(DType::kF32, {c.num_kv_heads, c.num_keys});
    key_redundancy(got.view(), k_dev.view(), 0.5f);
    const double err = test::relative_error(test::download_f32(got), ref);
    std::printf("PARITY key_redundancy %-20s rel_err %.3e\n", c.name, err);
    EXPECT_LT(err, 1e-5) << c.name;
  }
}

// R-KV's pooling and mix over the same importance and redundancy: float arithmetic on both, so they agree to the
// last bits (a fused multiply-add on one side at most).
TEST(CudaDecodeScoringOpsTest, RedundancyAwareScoresMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 12400;
  for (const ScoreCase& c : kScoreCases) {
    const int32_t scored = std::max(1, c.num_keys - c.rows);
    const Tensor importance = random_host({c.num_kv_heads, scored}, seed += 10, DType::kF32);
    const Tensor redundancy = random_host({c.num_kv_heads, c.num_keys}, seed + 1, DType::kF32);
    for (const int32_t kernel : {1, 7}) {
      Tensor ref = Tensor::empty(DType::kF32, {c.num_kv_heads, scored});
      redundancy_aware_scores(ref.view(), importance.view(), redundancy.view(), kernel, 0.07f);
      const Tensor importance_dev = upload(importance, DType::kF32), redundancy_dev = upload(redundancy, DType::kF32);
      Tensor got = poisoned(DType::kF32, {c.num_kv_heads, scored});
      redundancy_aware_scores(got.view(), importance_dev.view(), redundancy_dev.view(), kernel, 0.07f);
      const double err = test::relative_error(test::download_f32(got), ref);
      std::printf("PARITY redundancy_aware_scores %-20s kernel %d rel_err %.3e\n", c.name, kernel, err);
      EXPECT_LT(err, 1e-6) << c.name << " kernel " << kernel;
    }
  }
}

}  // namespace
}  // namespace se
