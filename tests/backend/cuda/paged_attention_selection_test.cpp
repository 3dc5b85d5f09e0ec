// Parity of the CUDA paged attention over a selection (what Quest and OmniKV decode with) with the
// CPU reference: token and page selections drawn as random ascending subsets of each KV head's
// stream (sparse, dense, empty, a single entry, full, or no list for some sequences of the batch),
// page sizes 16 and 64, head_dim 64/128/256, GQA groups 1/4/8, ragged batches mixing decode rows
// and prefill chunks (whose earlier rows must not see selected tokens after them; an unselected chunk beside
// selected decode rows runs the dense prefill kernel), unequal per-head
// stream lengths, sliding windows and soft-capping, and a 2K selection of a 128K stream. Small
// batches split their selected keys across CTAs, so the split-KV path runs too.
#include <gtest/gtest.h>

#include <vector>

#include "paged_cache_fixture.h"

namespace se {
namespace {

using test::Kernel;
using test::PagedCase;
using test::run_paged_attention_case;
using test::SelectSpec;

constexpr SelectSpec kNoList{SelectSpec::kNone};
constexpr SelectSpec kEmpty{SelectSpec::kEmpty};
constexpr SelectSpec kFull{SelectSpec::kFull};
constexpr SelectSpec kOne{SelectSpec::kOne};
constexpr SelectSpec random_subset(double fraction) { return {SelectSpec::kRandom, fraction}; }
constexpr SelectSpec budget(int32_t count) { return {SelectSpec::kBudget, 0.0, count}; }

PagedCase with_selection(PagedCase c, SelectionUnit unit, std::vector<SelectSpec> select) {
  c.selection_unit = unit;
  c.select = std::move(select);
  return c;
}

std::vector<PagedCase> short_cases() {
  constexpr SelectionUnit kToken = SelectionUnit::kToken;
  constexpr SelectionUnit kPage = SelectionUnit::kPage;
  std::vector<PagedCase> cases;
  cases.push_back(
      with_selection({"tok decode ps16 g4 d128", 16, 2, 4, 128, {{3000, 1}, {17, 1}, {900, 1}}},
                     kToken, {random_subset(0.1), random_subset(0.5), kNoList}));
  cases.push_back(
      with_selection({"page decode ps16 g8 d128", 16, 2, 8, 128, {{3000, 1}, {40, 1}, {900, 1}}},
                     kPage, {random_subset(0.1), kFull, kOne}));
  // Quest's mixed batch: selected decode rows beside an unselected prefill chunk, which runs the dense kernel.
  cases.push_back(with_selection(
      {"page decode + dense prefill ps16 g4 d128", 16, 2, 4, 128, {{3000, 1}, {2000, 300}, {900, 1}}}, kPage,
      {random_subset(0.1), kNoList, kFull}));
  cases.push_back(with_selection(
      {"tok mixed ragged ps64 g1 d64",
       64,
       4,
       1,
       64,
       {{5000, 1}, {700, 64}, {300, 300}, {64, 1}, {2000, 7}}},
      kToken, {random_subset(0.05), random_subset(0.3), random_subset(0.5), kEmpty, kFull}));
  cases.push_back(with_selection({"page prefill ps64 g4 d256 window+cap",
                                  64,
                                  1,
                                  4,
                                  256,
                                  {{4000, 40}, {1500, 1}, {90, 90}},
                                  512,
                                  50.0f},
                                 kPage, {random_subset(0.3), random_subset(0.5), kFull}));
  cases.push_back(with_selection({"tok window+cap ps16 g8 d256",
                                  16,
                                  1,
                                  8,
                                  256,
                                  {{2500, 1}, {1200, 33}},
                                  300,
                                  30.0f,
                                  0,
                                  DType::kF32,
                                  DType::kF32},
                                 kToken, {random_subset(0.2), random_subset(0.4)}));
  cases.push_back(with_selection({"tok per-head lengths ps16 g8 d64",
                                  16,
                                  4,
                                  8,
                                  64,
                                  {{2000, 3}, {260, 1}, {129, 40}},
                                  0,
                                  0.0f,
                                  9},
                                 kToken, {random_subset(0.25), kOne, random_subset(0.6)}));
  cases.push_back(with_selection({"page per-head lengths ps16 g4 d128",
                                  16,
                                  4,
                                  4,
                                  128,
                                  {{2000, 3}, {260, 1}, {129, 40}},
                                  0,
                                  0.0f,
                                  9},
                                 kPage, {random_subset(0.25), kEmpty, random_subset(0.6)}));
  cases.push_back(
      with_selection({"page window 100 ps16 g1 d128", 16, 2, 1, 128, {{3000, 1}, {777, 300}}, 100},
                     kPage, {random_subset(0.5), random_subset(0.7)}));
  cases.push_back(with_selection({"tok f32 out ps64 g4 d128",
                                  64,
                                  2,
                                  4,
                                  128,
                                  {{4097, 1}, {63, 1}, {800, 120}},
                                  0,
                                  0.0f,
                                  0,
                                  DType::kBF16,
                                  DType::kF32},
                                 kToken, {random_subset(0.02), kFull, random_subset(0.5)}));
  cases.push_back(with_selection({"tok batch 32 decode ps16 g4 d128", 16, 2, 4, 128,
                                  std::vector<test::SeqSpec>(32, test::SeqSpec{1500, 1})},
                                 kToken, std::vector<SelectSpec>(32, random_subset(0.2))));
  return cases;
}

std::vector<PagedCase> long_cases() {
  constexpr SelectionUnit kToken = SelectionUnit::kToken;
  constexpr SelectionUnit kPage = SelectionUnit::kPage;
  std::vector<PagedCase> cases;
  // Quest's decode: 2K tokens (128 pages of 16) of a 128K stream; the last page is usually chosen.
  cases.push_back(with_selection(
      {"page 2K of 128K decode ps16 g4 d128", 16, 2, 4, 128, {{131000, 1}}}, kPage, {budget(128)}));
  // OmniKV's decode: 2K selected tokens of 32K, batch of 4 with one unselected sequence.
  cases.push_back(with_selection({"tok 2K of 32K decode ps16 g4 d128",
                                  16,
                                  4,
                                  4,
                                  128,
                                  {{32768, 1}, {32768, 1}, {20000, 1}, {3000, 1}}},
                                 kToken,
                                 {budget(2048), budget(2048), random_subset(0.1), kNoList}));
  cases.push_back(with_selection(
      {"page 32K chunk + decode ps64 g8 d128", 64, 2, 8, 128, {{32768, 64}, {16000, 1}}}, kPage,
      {random_subset(0.1), random_subset(0.05)}));
  cases.push_back(with_selection(
      {"tok 32K window 4K ps64 g1 d64", 64, 2, 1, 64, {{32768, 1}, {30000, 17}}, 4096}, kToken,
      {random_subset(0.3), random_subset(0.5)}));
  return cases;
}

TEST(CudaSelectedAttentionTest, TiledMatchesCpuOnShortContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 5000;
  for (const PagedCase& c : short_cases()) run_paged_attention_case(c, Kernel::kTiled, seed += 10);
}

TEST(CudaSelectedAttentionTest, SimpleMatchesCpuOnShortContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 6000;
  for (const PagedCase& c : short_cases()) {
    PagedCase f32 = c;
    f32.out_dtype = DType::kF32;  // fp32 end to end: the 1e-5 bound applies
    run_paged_attention_case(f32, Kernel::kSimple, seed += 10);
  }
}

TEST(CudaSelectedAttentionTest, TiledMatchesCpuOnLongContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 7000;
  for (const PagedCase& c : long_cases()) run_paged_attention_case(c, Kernel::kTiled, seed += 10);
}

TEST(CudaSelectedAttentionTest, SimpleMatchesCpuOnLongContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 8000;
  for (const PagedCase& c : long_cases()) {
    PagedCase f32 = c;
    f32.out_dtype = DType::kF32;
    run_paged_attention_case(f32, Kernel::kSimple, seed += 10);
  }
}

}  // namespace
}  // namespace se
