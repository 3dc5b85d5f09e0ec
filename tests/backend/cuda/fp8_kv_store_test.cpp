// Parity of the FP8 (e4m3) store's ops on the GPU with the CPU's: write_kv's codes byte for byte (head 0's keys
// saturate at +-448, so the saturation matches too), the scales fp8_kv_scales computes on the device bit for bit,
// the tiled attention over the codes against the CPU's FP8 attention over the same pages (bf16 tolerance: the GPU
// decodes each row to bf16 for the tensor cores; page sizes 16 and 64, GQA 1, 4 and 8, ragged batches mixing decode
// rows with fresh and chunked prefill, whose chunks read earlier chunks' pages, head_dim 64, 128 and 256), and the
// eviction methods' ops over the codes: attention_scores decoding the keys (bf16 tolerance), compact_kv and
// move_kv_rows moving them byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "paged_cache_fixture.h"

namespace se {
namespace {

using test::Kernel;
using test::PagedCase;
using test::SeqSpec;

PagedCase fp8_case(std::string name, int32_t page_size, int32_t num_kv_heads, int32_t group, int32_t head_dim,
                   std::vector<SeqSpec> seqs) {
  PagedCase c{std::move(name), page_size, num_kv_heads, group, head_dim, std::move(seqs)};
  c.fp8 = true;
  return c;
}

std::vector<PagedCase> fp8_cases() {
  std::vector<PagedCase> cases;
  cases.push_back(fp8_case("fp8 decode ps16 g4 d128", 16, 2, 4, 128, {{1, 1}, {17, 1}, {300, 1}}));
  cases.push_back(fp8_case("fp8 decode ps64 g8 d128", 64, 2, 8, 128, {{4000, 1}, {65, 1}}));
  cases.push_back(fp8_case("fp8 decode ps16 g1 d64", 16, 4, 1, 64, {{2000, 1}, {33, 1}, {1, 1}}));
  cases.push_back(fp8_case("fp8 fresh prefill ps16 g8 d64", 16, 1, 8, 64, {{37, 37}}));
  cases.push_back(fp8_case("fp8 fresh prefill ps64 g4 d128", 64, 2, 4, 128, {{700, 700}}));
  cases.push_back(fp8_case("fp8 chunk over earlier chunks ps16 g4 d128", 16, 2, 4, 128, {{1500, 256}, {600, 64}}));
  cases.push_back(
      fp8_case("fp8 mixed ragged ps64 g1 d128", 64, 4, 1, 128, {{1000, 1}, {64, 64}, {513, 100}, {5, 1}, {2000, 7}}));
  cases.push_back(fp8_case("fp8 mixed ragged ps16 g8 d64", 16, 2, 8, 64, {{900, 3}, {260, 1}, {129, 40}}));
  cases.push_back(fp8_case("fp8 decode ps16 g4 d256", 16, 2, 4, 256, {{3000, 1}, {63, 1}}));
  cases.push_back(fp8_case("fp8 prefill ps64 g4 d256", 64, 1, 4, 256, {{900, 300}, {40, 40}}));
  PagedCase windowed = fp8_case("fp8 window+softcap ps16 g4 d128", 16, 2, 4, 128, {{1500, 200}, {300, 1}});
  windowed.window = 256;
  windowed.softcap = 30.0f;
  cases.push_back(windowed);
  PagedCase f32 = fp8_case("fp8 f32 q and out ps64 g4 d128", 64, 2, 4, 128, {{3000, 100}, {129, 1}});
  f32.q_dtype = f32.out_dtype = DType::kF32;
  cases.push_back(f32);
  cases.push_back(fp8_case("fp8 decode 32K ps16 g4 d128", 16, 8, 4, 128, {{32768, 1}, {20000, 1}}));
  return cases;
}

TEST(CudaFp8KvStoreTest, WritesTheCpuCodesAndAttendsLikeTheCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  uint64_t seed = 7000;
  for (const PagedCase& c : fp8_cases()) test::run_paged_attention_case(c, Kernel::kTiled, seed += 10);
}

// One KV head of each tensor is all zeros (scale 1.0, not a division by zero); the others differ in magnitude.
Tensor rows_for_scales(int64_t rows, int64_t heads, int64_t dim, uint64_t seed, DType dtype, int64_t zero_head) {
  Tensor t = test::random_host({rows, heads, dim}, seed, dtype);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < dim; ++d) {
        float& x = t.data<float>()[(r * heads + h) * dim + d];
        x = h == zero_head ? 0.0f : test::representable(x * static_cast<float>(1 + 3 * h), dtype);
      }
  return t;
}

TEST(CudaFp8KvStoreTest, ScalesFromTheFirstBatchAreTheCpus) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  for (const DType dtype : {DType::kBF16, DType::kF32}) {
    for (const int64_t rows : {int64_t{1}, int64_t{37}, int64_t{4096}}) {
      const int64_t heads = 4, dim = 128;
      const Tensor k = rows_for_scales(rows, heads, dim, 11 + rows, dtype, 2);
      const Tensor v = rows_for_scales(rows, heads, dim, 13 + rows, dtype, 0);
      std::vector<float> k_want(heads), v_want(heads);
      fp8_kv_scales(TensorView{k_want.data(), DType::kF32, {heads}}, TensorView{v_want.data(), DType::kF32, {heads}},
                    k.view(), v.view());
      Tensor k_got = test::poisoned(DType::kF32, {heads}), v_got = test::poisoned(DType::kF32, {heads});
      fp8_kv_scales(k_got.view(), v_got.view(), test::upload(k, dtype).view(), test::upload(v, dtype).view());
      const Tensor k_host = cuda::to_host(k_got), v_host = cuda::to_host(v_got);
      for (int64_t h = 0; h < heads; ++h) {  // equal values: the same bits, as the scales are positive
        EXPECT_EQ(k_host.data<float>()[h], k_want[static_cast<size_t>(h)]) << dtype_name(dtype) << rows << " " << h;
        EXPECT_EQ(v_host.data<float>()[h], v_want[static_cast<size_t>(h)]) << dtype_name(dtype) << rows << " " << h;
      }
      EXPECT_EQ(k_want[2], 1.0f);
      EXPECT_EQ(v_want[0], 1.0f);
    }
  }
}

// A sequence of 40 query rows over streams of unequal lengths, and a decode row, the scored sequence not the first.
PagedCase scoring_case() {
  PagedCase c = fp8_case("fp8 scores ps16 g4 d128", 16, 2, 4, 128, {{300, 1}, {700, 40}});
  c.head_skew = 37;
  return c;
}

TEST(CudaFp8KvStoreTest, AttentionScoresDecodeTheCodes) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const PagedCase c = scoring_case();
  test::PagedCacheFixture cache(c, 8100);
  const int32_t slice = 1, n = c.seqs[1].num_new, heads = c.num_kv_heads * c.group;
  const Tensor q = test::random_host({n, heads, c.head_dim}, 8101, DType::kBF16);
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (const ScoreReduce reduce : {ScoreReduce::kSum, ScoreReduce::kMax}) {
    Tensor want = Tensor::empty(DType::kF32, {heads, c.seqs[1].num_tokens});
    Tensor got = Tensor::empty(DType::kF32, want.shape());
    attention_scores(want.view(), q.view(), cache.cpu_view(), slice, params, reduce);
    attention_scores(got.view(), test::upload(q, DType::kBF16).view(), cache.host_tables_gpu_view(), slice, params,
                     reduce);
    const double err = test::relative_error(got, want);
    std::printf("PARITY attention_scores over fp8 pages (%s) rel_err %.3e\n",
                reduce == ScoreReduce::kSum ? "sum" : "max", err);
    EXPECT_LT(err, 1e-2);
  }
}

TEST(CudaFp8KvStoreTest, EvictionMovesTheCodesAsBytes) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const PagedCase c = scoring_case();
  test::PagedCacheFixture cache(c, 8200);
  const AttentionView cpu = cache.cpu_view();
  // Every KV head of sequence 1 keeps every third token; sequence 0's streams refill one slot from their last token.
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(c.num_kv_heads));
  std::vector<StreamCompaction> streams;
  std::vector<KvRowMove> moves;
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    for (int32_t j = 0; j < cache.num_tokens(1, h); j += 3) kept[static_cast<size_t>(h)].push_back(j);
    streams.push_back(StreamCompaction{cpu.seqs[1].page_ids + static_cast<int64_t>(h) * cpu.seqs[1].stride,
                                       kept[static_cast<size_t>(h)]});
    const int32_t* pages = cpu.seqs[0].page_ids + static_cast<int64_t>(h) * cpu.seqs[0].stride;
    const int32_t last = cache.num_tokens(0, h) - 1, hole = 5 + h;
    moves.push_back(
        KvRowMove{pages[last / c.page_size], last % c.page_size, pages[hole / c.page_size], hole % c.page_size});
  }
  compact_kv(cpu, streams);
  compact_kv(cache.host_tables_gpu_view(), streams);
  EXPECT_EQ(cache.count_pool_mismatches(), 0) << "compact_kv";
  move_kv_rows(cpu, moves);
  move_kv_rows(cache.host_tables_gpu_view(), moves);
  EXPECT_EQ(cache.count_pool_mismatches(), 0) << "move_kv_rows";
}

}  // namespace
}  // namespace se
