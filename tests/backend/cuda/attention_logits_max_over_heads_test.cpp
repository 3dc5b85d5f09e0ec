// Parity of the CUDA twin of OmniKV's filter logits with the CPU reference, on the sparse methods'
// contract: the cache's host tables over the device pool, q on the device, the logits in host
// memory. fp32 dot products of the same bf16 keys: only the summation order differs (1e-5). Page
// sizes 16 and 64, head_dim 64/128/256, GQA groups 1/4/8, unequal per-head stream lengths, streams
// up to 32K, the whole shortest stream or a prefix of it.
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
using test::upload;

TEST(CudaAttentionLogitsMaxOverHeadsTest, MatchesCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<PagedCase> cases = {
      {"ps16 d128 g4 32K", 16, 8, 4, 128, {{32768, 1}, {4000, 1}}, 0, 0.0f, 2},
      {"ps64 d64 g8", 64, 2, 8, 64, {{5000, 1}, {63, 1}}},
      {"ps16 d256 g1 per-head lengths", 16, 4, 1, 256, {{3000, 1}, {40, 1}}, 0, 0.0f, 7},
  };
  uint64_t seed = 9500;
  for (const PagedCase& c : cases) {
    SCOPED_TRACE(c.name);
    PagedCacheFixture cache(c, seed += 10);
    const int64_t heads = int64_t{c.num_kv_heads} * c.group;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      int32_t min_len = cache.num_tokens(s, 0);
      for (int32_t h = 1; h < c.num_kv_heads; ++h)
        min_len = std::min(min_len, cache.num_tokens(s, h));
      for (int32_t num_keys : {min_len, min_len / 3 + 1}) {
        for (DType q_dtype : {DType::kF32, DType::kBF16}) {
          const Tensor q = random_host({heads, c.head_dim}, seed + 100 * s + num_keys, q_dtype);
          Tensor ref = Tensor::empty(DType::kF32, {num_keys});
          attention_logits_max_over_heads(ref.view(), q.view(), cache.cpu_view(),
                                          static_cast<int32_t>(s), scale);
          Tensor got = Tensor::empty(DType::kF32, {num_keys});
          std::fill_n(got.data<float>(), got.numel(), std::numeric_limits<float>::quiet_NaN());
          const Tensor q_dev = upload(q, q_dtype);
          attention_logits_max_over_heads(got.view(), q_dev.view(), cache.host_tables_gpu_view(),
                                          static_cast<int32_t>(s), scale);
          const double err = test::relative_error(got, ref);
          std::printf(
              "PARITY attention_logits_max_over_heads %-30s seq %zu q %-4s keys %-6d rel_err "
              "%.3e\n",
              c.name.c_str(), s, dtype_name(q_dtype).data(), num_keys, err);
          EXPECT_LT(err, 1e-5);
        }
      }
    }
  }
}

}  // namespace
}  // namespace se
