// Parity of the CUDA write_kv and paged attention (tiled and simple kernels) with the CPU reference
// over the same paged cache: the CPU pool holds f32 copies of the GPU's bf16 pages, pages are
// shuffled across the pool and filled with random data beyond each stream's end (masking must hide
// it). Page sizes 16 and 64, contexts 1 to 128K, GQA groups 1 to 32, ragged batches mixing prefill
// chunks and decode rows, windows and soft-capping. The head_dim-128 prefill launches take the
// warp-specialized Hopper kernel, or the tiled one under SE_PREFILL_KERNEL=tiled.
#include <gtest/gtest.h>

#include <vector>

#include "paged_cache_fixture.h"

namespace se {
namespace {

using test::Kernel;
using test::PagedCase;
using test::run_paged_attention_case;
using test::SeqSpec;

std::vector<PagedCase> short_cases() {
  std::vector<PagedCase> cases;
  cases.push_back({"decode ps16 g4 d128", 16, 2, 4, 128, {{1, 1}, {17, 1}, {300, 1}}});
  cases.push_back({"fresh prefill ps16 g8 d64",
                   16,
                   1,
                   8,
                   64,
                   {{37, 37}},
                   0,
                   0.0f,
                   0,
                   DType::kF32,
                   DType::kF32});
  cases.push_back({"mixed ragged ps64 g1 d128",
                   64,
                   4,
                   1,
                   128,
                   {{1000, 1}, {64, 64}, {513, 100}, {5, 1}, {2000, 7}}});
  cases.push_back(
      {"gemma window+softcap d256", 16, 1, 4, 256, {{1500, 20}, {900, 1}, {40, 40}}, 512, 50.0f});
  cases.push_back({"group 7 mixed ps16",
                   16,
                   2,
                   7,
                   128,
                   {{700, 33}, {100, 1}, {1, 1}},
                   0,
                   0.0f,
                   0,
                   DType::kF32,
                   DType::kBF16});
  cases.push_back({"group 32 decode d64", 64, 1, 32, 64, {{3000, 1}, {50, 1}}});
  cases.push_back(
      {"per-head lengths ps16 g4", 16, 4, 4, 128, {{900, 3}, {260, 1}, {129, 40}}, 0, 0.0f, 9});
  cases.push_back({"window 100 prefill ps64", 64, 2, 4, 64, {{777, 300}, {65, 1}}, 100});
  // Head dim 64 with several KV heads, ragged multi-tile prefill and per-head lengths (the dense twins of two
  // selection cases).
  cases.push_back(
      {"ragged ps64 g1 d64", 64, 4, 1, 64, {{5000, 1}, {700, 64}, {300, 300}, {64, 1}, {2000, 7}}});
  cases.push_back(
      {"per-head lengths ps16 g8 d64", 16, 4, 8, 64, {{2000, 3}, {260, 1}, {129, 40}}, 0, 0.0f, 9});
  // Head dim 128 prefill: window and soft-cap masks (group 4); a group of 8 (16 rows per tile) with f32 output.
  cases.push_back({"window+softcap prefill ps16 g4 d128",
                   16,
                   2,
                   4,
                   128,
                   {{1500, 600}, {300, 300}, {40, 1}},
                   256,
                   30.0f});
  cases.push_back({"prefill g8 f32 out ps16 d128",
                   16,
                   1,
                   8,
                   128,
                   {{3000, 1000}, {129, 129}},
                   0,
                   0.0f,
                   0,
                   DType::kBF16,
                   DType::kF32});
  cases.push_back({"decode f32 out d256",
                   16,
                   2,
                   2,
                   256,
                   {{4097, 1}, {63, 1}},
                   0,
                   0.0f,
                   0,
                   DType::kBF16,
                   DType::kF32});
  return cases;
}

std::vector<PagedCase> long_cases() {
  std::vector<PagedCase> cases;
  cases.push_back({"decode 32K llama8b ps16", 16, 8, 4, 128, {{32768, 1}, {20000, 1}}});
  cases.push_back(
      {"decode 32K g8 ps64", 64, 2, 8, 128, {{32768, 1}}, 0, 0.0f, 0, DType::kF32, DType::kF32});
  cases.push_back(
      {"decode 32K g1 ragged ps64", 64, 4, 1, 128, {{32768, 1}, {8191, 1}, {1, 1}, {4097, 1}}});
  cases.push_back({"chunk vs 32K prefix + decode", 16, 2, 4, 128, {{32768, 64}, {16000, 1}}});
  cases.push_back({"fresh prefill 2K ps64", 64, 2, 4, 128, {{2048, 2048}}});
  cases.push_back({"decode 128K llama8b ps16", 16, 8, 4, 128, {{131072, 1}}});
  cases.push_back(
      {"decode batch 64 x 2K ps16", 16, 8, 4, 128, std::vector<SeqSpec>(64, SeqSpec{2048, 1})});
  return cases;
}

TEST(CudaPagedAttentionTest, TiledMatchesCpuOnShortContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 1000;
  for (const PagedCase& c : short_cases()) run_paged_attention_case(c, Kernel::kTiled, seed += 10);
}

TEST(CudaPagedAttentionTest, SimpleMatchesCpuOnShortContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 2000;
  for (const PagedCase& c : short_cases()) {
    PagedCase f32 = c;
    f32.out_dtype = DType::kF32;  // fp32 end to end: the 1e-5 bound applies
    run_paged_attention_case(f32, Kernel::kSimple, seed += 10);
  }
}

TEST(CudaPagedAttentionTest, TiledMatchesCpuOnLongContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 3000;
  for (const PagedCase& c : long_cases()) run_paged_attention_case(c, Kernel::kTiled, seed += 10);
}

TEST(CudaPagedAttentionTest, SimpleMatchesCpuOnLongContexts) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 4000;
  for (const PagedCase& c : long_cases()) run_paged_attention_case(c, Kernel::kSimple, seed += 10);
}

}  // namespace
}  // namespace se
