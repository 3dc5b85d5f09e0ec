// Parity of the CUDA twins of Quest's page-bound ops with the CPU reference, on both table placements
// the ops take: the cache's host tables over the device pool (staged by the op) and device tables (the
// mirror a decode step passes); bounds (bf16, the pool's type) and q on the device, scores in host
// memory. Bounds must be exact (min / max of the same bf16 values); scores differ only in the order of
// D fp32 additions (1e-5). Page sizes 16 and 64, head_dim 64/128/256, GQA groups 1/4/8,
// ragged batches of new rows (pages a step touches only partly, pages it fills from scratch),
// unequal per-head stream lengths, streams up to 32K. The device page choice (select_pages_by_key_bounds) must
// pick the CPU's pages: exactly on planted ties (the lower page wins on both), and elsewhere up to pages whose
// reduced bound lies within rounding of the cut.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
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

// The bounds of every pool page on the CPU and on the GPU (from host tables, and from device tables), after one
// update_page_key_bounds of `cache`'s step.
struct BoundsPair {
  Tensor cpu, gpu, gpu_device_tables;
};

BoundsPair update_both(const PagedCacheFixture& cache, const PagedCase& c) {
  BoundsPair b;
  b.cpu = Tensor::empty(DType::kF32, {cache.num_pool_pages(), 2, c.head_dim});
  std::fill_n(b.cpu.data<float>(), b.cpu.numel(), kUnwritten);
  b.gpu = upload(b.cpu, DType::kBF16);
  b.gpu_device_tables = upload(b.cpu, DType::kBF16);
  int32_t max_new = 0;
  for (const SeqSpec& seq : c.seqs) max_new = std::max(max_new, seq.num_new);
  update_page_key_bounds(b.cpu.view(), cache.cpu_view(), max_new);
  update_page_key_bounds(b.gpu.view(), cache.host_tables_gpu_view(), max_new);
  update_page_key_bounds(b.gpu_device_tables.view(), cache.gpu_view(), max_new);
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
    const Tensor got_device_tables = test::download_f32(b.gpu_device_tables);
    int64_t mismatches = 0, updated = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      mismatches += got.data<float>()[i] != b.cpu.data<float>()[i];
      mismatches += got_device_tables.data<float>()[i] != b.cpu.data<float>()[i];
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

// The CPU's group-reduced bound of every page but the last of one KV head (scores [H, max_pages] from
// page_key_bound_scores), as select_pages_by_key_bounds ranks them.
std::vector<float> reduced_bounds(const Tensor& scores, int32_t kv_head, int64_t group, int32_t num_candidates,
                                  GroupReduce reduce) {
  const int64_t width = scores.dim(1);
  std::vector<float> out;
  for (int32_t p = 0; p < num_candidates; ++p) {
    float acc = scores.data<float>()[kv_head * group * width + p];
    for (int64_t g = 1; g < group; ++g) {
      const float v = scores.data<float>()[(kv_head * group + g) * width + p];
      acc = reduce == GroupReduce::kMax ? std::max(acc, v) : acc + v;
    }
    out.push_back(reduce == GroupReduce::kMean ? acc / static_cast<float>(group) : acc);
  }
  return out;
}

TEST(CudaPageKeyBoundsTest, DeviceSelectionPicksTheCpuPages) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<PagedCase> cases = {
      {"ps16 d128 g4 32K", 16, 8, 4, 128, {{32768, 32768}, {1000, 1000}}, 0, 0.0f, 3},
      {"ps64 d64 g8", 64, 2, 8, 64, {{5000, 5000}, {64, 64}, {700, 700}}},
      {"ps16 d128 g1 per-head lengths", 16, 4, 1, 128, {{3000, 3000}, {17, 17}}, 0, 0.0f, 5},
  };
  uint64_t seed = 9200;
  int64_t num_lists = 0, num_near_tie_swaps = 0;
  for (const PagedCase& c : cases) {
    SCOPED_TRACE(c.name);
    PagedCacheFixture cache(c, seed += 10);
    BoundsPair b = update_both(cache, c);
    const int64_t heads = int64_t{c.num_kv_heads} * c.group;
    const auto num_seqs = static_cast<int32_t>(c.seqs.size());
    const AttentionView cpu_view = cache.cpu_view();
    int32_t max_pages = 0;
    for (int32_t s = 0; s < num_seqs; ++s)
      for (int32_t h = 0; h < c.num_kv_heads; ++h)
        max_pages = std::max(max_pages, (cache.num_tokens(static_cast<size_t>(s), h) + c.page_size - 1) / c.page_size);
    for (const bool planted_tie : {false, true}) {
      if (planted_tie) {
        // Every page of KV head 0 of every sequence gets the bounds of its first page: all its candidates tie.
        for (int32_t s = 0; s < num_seqs; ++s) {
          const int32_t* pages = cpu_view.seqs[s].page_ids;
          const int64_t row = 2 * c.head_dim;
          for (int32_t p = 1; p < (cache.num_tokens(static_cast<size_t>(s), 0) + c.page_size - 1) / c.page_size; ++p)
            std::copy_n(b.cpu.data<float>() + pages[0] * row, row, b.cpu.data<float>() + pages[p] * row);
        }
        b.gpu = upload(b.cpu, DType::kBF16);
      }
      for (int32_t budget : {1, 8, 128}) {
        for (GroupReduce reduce : {GroupReduce::kMean, GroupReduce::kMax, GroupReduce::kSum}) {
          const Tensor q = random_host({cache.num_rows(), heads, c.head_dim}, seed + static_cast<uint64_t>(budget),
                                       DType::kF32);
          const Tensor q_dev = upload(q, DType::kF32);
          Tensor ref = Tensor::empty(DType::kI32, {num_seqs, c.num_kv_heads, budget});
          Tensor ref_counts = Tensor::empty(DType::kI32, {num_seqs, c.num_kv_heads});
          select_pages_by_key_bounds(ref.view(), ref_counts.view(), q.view(), b.cpu.view(), cpu_view, budget,
                                     max_pages, reduce);
          // Both table placements, the device-tables one with a stride past the longest stream (a decode step's
          // stable capacity).
          for (const bool device_tables : {false, true}) {
            Tensor lists = test::poisoned(DType::kI32, {num_seqs, c.num_kv_heads, budget});
            Tensor counts = test::poisoned(DType::kI32, {num_seqs, c.num_kv_heads});
            select_pages_by_key_bounds(lists.view(), counts.view(), q_dev.view(), b.gpu.view(),
                                       device_tables ? cache.gpu_view() : cache.host_tables_gpu_view(), budget,
                                       device_tables ? max_pages + 300 : max_pages, reduce);
            const Tensor got = cuda::to_host(lists);
            const Tensor got_counts = cuda::to_host(counts);
            for (int32_t s = 0; s < num_seqs; ++s) {
              const auto seq = static_cast<size_t>(s);
              const TensorView last_row{q.data<float>() + (cpu_view.q_indptr[s + 1] - 1) * heads * c.head_dim,
                                        DType::kF32, Shape{heads, c.head_dim}, Device::kCpu};
              int32_t seq_pages = 0;
              for (int32_t h = 0; h < c.num_kv_heads; ++h)
                seq_pages = std::max(seq_pages, (cache.num_tokens(seq, h) + c.page_size - 1) / c.page_size);
              Tensor scores = Tensor::empty(DType::kF32, {heads, seq_pages});
              page_key_bound_scores(scores.view(), last_row, b.cpu.view(), cpu_view, s);
              for (int32_t h = 0; h < c.num_kv_heads; ++h) {
                const int64_t at = int64_t{s} * c.num_kv_heads + h;
                const int32_t n = ref_counts.data<int32_t>()[at];
                ASSERT_EQ(got_counts.data<int32_t>()[at], n) << "seq " << s << " head " << h;
                const int32_t* want = ref.data<int32_t>() + at * budget;
                const int32_t* have = got.data<int32_t>() + at * budget;
                ASSERT_TRUE(std::is_sorted(have, have + n) && std::adjacent_find(have, have + n) == have + n);
                const int32_t num_pages = (cache.num_tokens(seq, h) + c.page_size - 1) / c.page_size;
                if (n > 0) ASSERT_EQ(have[n - 1], num_pages - 1) << "the last page closes every list";
                ++num_lists;
                if (std::equal(want, want + n, have)) continue;
                ASSERT_FALSE(planted_tie && h == 0) << "a tie must go to the lower page on both backends";
                // Pages chosen by one side only must sit within rounding of the cut.
                ASSERT_GE(budget, 2);
                const std::vector<float> r = reduced_bounds(scores, h, c.group, num_pages - 1, reduce);
                std::vector<float> sorted = r;
                std::sort(sorted.begin(), sorted.end(), std::greater<float>());
                const float cut = sorted[static_cast<size_t>(budget - 2)];
                std::set<int32_t> a(want, want + n - 1), g(have, have + n - 1);
                for (int32_t p : a) if (!g.count(p)) EXPECT_NEAR(r[static_cast<size_t>(p)], cut, 1e-4 * std::max(1.0f, std::abs(cut)));
                for (int32_t p : g) if (!a.count(p)) EXPECT_NEAR(r[static_cast<size_t>(p)], cut, 1e-4 * std::max(1.0f, std::abs(cut)));
                ++num_near_tie_swaps;
              }
            }
          }
        }
      }
    }
  }
  std::printf("PARITY select_pages_by_key_bounds %lld lists, %lld differ only at near-ties of the cut\n",
              static_cast<long long>(num_lists), static_cast<long long>(num_near_tie_swaps));
  EXPECT_LE(num_near_tie_swaps * 20, num_lists);
}

}  // namespace
}  // namespace se
