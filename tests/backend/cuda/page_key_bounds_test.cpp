// Parity of the CUDA twins of Quest's page-bound ops with the CPU reference, on the sparse methods'
// contract: the cache's host tables over the device pool, bounds and q on the device, scores in
// host memory. Bounds must be exact (min / max of the same bf16 values); scores differ only in the
// order of D fp32 additions (1e-5). Page sizes 16 and 64, head_dim 64/128/256, GQA groups 1/4/8,
// ragged batches of new rows (pages a step touches only partly, pages it fills from scratch),
// unequal per-head stream lengths, streams up to 32K.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "paged_cache_fixture.h"

namespace se {
namespace {

using test::PagedCacheFixture;
using test::PagedCase;
using test::random_host;
using test::SeqSpec;
using test::upload;

constexpr float kUnwritten = 7.0f;  // bounds of pages no step touched stay at this sentinel

// The bounds of every pool page on both sides, after one update_page_key_bounds of `cache`'s step.
struct BoundsPair {
  Tensor cpu, gpu;
};

BoundsPair update_both(const PagedCacheFixture& cache, const PagedCase& c) {
  BoundsPair b;
  b.cpu = Tensor::empty(DType::kF32, {cache.num_pool_pages(), 2, c.head_dim});
  std::fill_n(b.cpu.data<float>(), b.cpu.numel(), kUnwritten);
  b.gpu = upload(b.cpu, DType::kF32);
  update_page_key_bounds(b.cpu.view(), cache.cpu_view());
  update_page_key_bounds(b.gpu.view(), cache.host_tables_gpu_view());
  return b;
}

TEST(CudaPageKeyBoundsTest, UpdateMatchesCpuExactly) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<PagedCase> cases = {
      {"ps16 d128 g4 ragged", 16, 8, 4, 128, {{1, 1}, {17, 1}, {32, 1}, {300, 40}, {1000, 1000}}},
      {"ps64 d64 per-head lengths",
       64,
       4,
       1,
       64,
       {{5000, 1}, {700, 64}, {129, 129}, {64, 1}},
       0,
       0.0f,
       9},
      {"ps16 d256 32K prefill", 16, 2, 8, 256, {{32768, 32768}, {33, 2}}},
  };
  uint64_t seed = 9000;
  for (const PagedCase& c : cases) {
    SCOPED_TRACE(c.name);
    PagedCacheFixture cache(c, seed += 10);
    const BoundsPair b = update_both(cache, c);
    const Tensor got = test::download_f32(b.gpu);
    int64_t mismatches = 0, updated = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      mismatches += got.data<float>()[i] != b.cpu.data<float>()[i];
      updated += b.cpu.data<float>()[i] != kUnwritten;
    }
    std::printf(
        "PARITY update_page_key_bounds %-28s %lld of %lld bound values written, %lld differ\n",
        c.name.c_str(), static_cast<long long>(updated), static_cast<long long>(got.numel()),
        static_cast<long long>(mismatches));
    EXPECT_GT(updated, 0);
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(CudaPageKeyBoundsTest, ScoresMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  // Every sequence's step covers its whole stream, so every page has bounds.
  const std::vector<PagedCase> cases = {
      {"ps16 d128 g4 32K", 16, 8, 4, 128, {{32768, 32768}, {1000, 1000}}, 0, 0.0f, 3},
      {"ps64 d64 g8", 64, 2, 8, 64, {{5000, 5000}, {64, 64}, {65, 65}}},
      {"ps16 d256 g1 per-head lengths", 16, 4, 1, 256, {{3000, 3000}, {17, 17}}, 0, 0.0f, 5},
  };
  uint64_t seed = 9100;
  for (const PagedCase& c : cases) {
    SCOPED_TRACE(c.name);
    PagedCacheFixture cache(c, seed += 10);
    const BoundsPair b = update_both(cache, c);
    const int64_t heads = int64_t{c.num_kv_heads} * c.group;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      int64_t max_pages = 0;
      for (int32_t h = 0; h < c.num_kv_heads; ++h)
        max_pages =
            std::max<int64_t>(max_pages, (cache.num_tokens(s, h) + c.page_size - 1) / c.page_size);
      const int64_t width = max_pages + 2;  // two columns past every head's pages: -inf
      for (DType q_dtype : {DType::kF32, DType::kBF16}) {
        const Tensor q = random_host({heads, c.head_dim}, seed + 100 * s, q_dtype);
        Tensor ref = Tensor::empty(DType::kF32, {heads, width});
        page_key_bound_scores(ref.view(), q.view(), b.cpu.view(), cache.cpu_view(),
                              static_cast<int32_t>(s));
        Tensor got = Tensor::empty(DType::kF32, {heads, width});
        std::fill_n(got.data<float>(), got.numel(), std::numeric_limits<float>::quiet_NaN());
        const Tensor q_dev = upload(q, q_dtype);
        page_key_bound_scores(got.view(), q_dev.view(), b.gpu.view(), cache.host_tables_gpu_view(),
                              static_cast<int32_t>(s));
        double num = 0, den = 0;
        int64_t inf_mismatches = 0;
        for (int64_t i = 0; i < got.numel(); ++i) {
          const double r = ref.data<float>()[i], g = got.data<float>()[i];
          if (std::isinf(r) || !std::isfinite(g)) {
            inf_mismatches += !(std::isinf(r) && r < 0 && g == r);
            continue;
          }
          num += (g - r) * (g - r);
          den += r * r;
        }
        const double err = std::sqrt(num / (den + 1e-30));
        std::printf("PARITY page_key_bound_scores %-30s seq %zu q %-4s pages %-5lld rel_err %.3e\n",
                    c.name.c_str(), s, dtype_name(q_dtype).data(),
                    static_cast<long long>(max_pages), err);
        EXPECT_EQ(inf_mismatches, 0);
        EXPECT_LT(err, 1e-5);
      }
    }
  }
}

}  // namespace
}  // namespace se
