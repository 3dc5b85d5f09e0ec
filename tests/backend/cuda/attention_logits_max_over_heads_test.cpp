// Parity of the CUDA twin of OmniKV's filter logits with the CPU reference, on the sparse methods'
// contract: the cache's host tables over the device pool, q on the device, the logits in host
// memory. fp32 dot products of the same bf16 keys: only the summation order differs (1e-5). Page
// sizes 16 and 64, head_dim 64/128/256, GQA groups 1/4/8, unequal per-head stream lengths, streams
// up to 32K, the whole shortest stream or a prefix of it. The index ranked on the device
// (top_keys_by_logits_max_over_heads) keeps the CPU's tokens but for swaps at near-ties of the cut,
// and all-equal logits keep the lowest tokens on both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "paged_cache_fixture.h"

namespace se {
namespace {

using test::PagedCacheFixture;
using test::PagedCase;
using test::poisoned;
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
      const int32_t min_len = cache.shortest_stream(s);
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

TEST(CudaAttentionLogitsMaxOverHeadsTest, DeviceIndexKeepsTheCpuTokens) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<PagedCase> cases = {
      {"ps16 d128 g4 130K", 16, 8, 4, 128, {{130000, 1}, {9000, 1}}, 0, 0.0f, 2},
      {"ps64 d64 g8", 64, 2, 8, 64, {{5000, 1}, {700, 1}}},
  };
  uint64_t seed = 9700;
  int num_swaps = 0, num_kept = 0;
  for (const PagedCase& c : cases) {
    SCOPED_TRACE(c.name);
    PagedCacheFixture cache(c, seed += 10);
    const int64_t heads = int64_t{c.num_kv_heads} * c.group;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      const auto seq = static_cast<int32_t>(s);
      const int32_t num_keys = cache.shortest_stream(s);
      for (bool zero_query : {false, true}) {  // a zero query: every logit ties (+0 or -0)
        Tensor q = random_host({heads, c.head_dim}, seed + 100 * s, DType::kF32);
        if (zero_query) std::fill_n(q.data<float>(), q.numel(), 0.0f);
        Tensor logits = Tensor::empty(DType::kF32, {num_keys});
        attention_logits_max_over_heads(logits.view(), q.view(), cache.cpu_view(), seq, scale);
        for (int32_t wanted : {1, 2048, num_keys / 2}) {
          const int32_t k = std::min(wanted, num_keys);
          Tensor ref = Tensor::empty(DType::kI32, {k});
          top_keys_by_logits_max_over_heads(ref.view(), q.view(), cache.cpu_view(), seq, num_keys, scale);
          Tensor got_dev = poisoned(DType::kI32, {k});
          const Tensor q_dev = upload(q, DType::kF32);
          top_keys_by_logits_max_over_heads(got_dev.view(), q_dev.view(), cache.host_tables_gpu_view(), seq,
                                            num_keys, scale);
          const Tensor got = cuda::to_host(got_dev);
          const int32_t* g = got.data<int32_t>();
          const int32_t* r = ref.data<int32_t>();
          ASSERT_TRUE(std::is_sorted(g, g + k) && std::adjacent_find(g, g + k) == g + k && g[0] >= 0 &&
                      g[k - 1] < num_keys);
          if (zero_query) {
            for (int32_t i = 0; i < k; ++i) ASSERT_EQ(g[i], i) << "ties go to the lower token";
            continue;
          }
          // The k-th largest CPU logit: a token only one side keeps must sit at it.
          std::vector<float> sorted(logits.data<float>(), logits.data<float>() + num_keys);
          std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
          const float cut = sorted[static_cast<size_t>(k - 1)];
          std::vector<int32_t> only_got, only_ref;
          std::set_difference(g, g + k, r, r + k, std::back_inserter(only_got));
          std::set_difference(r, r + k, g, g + k, std::back_inserter(only_ref));
          for (int32_t t : only_got) EXPECT_NEAR(logits.data<float>()[t], cut, 1e-4 * std::max(1.0f, std::abs(cut)));
          for (int32_t t : only_ref) EXPECT_NEAR(logits.data<float>()[t], cut, 1e-4 * std::max(1.0f, std::abs(cut)));
          num_swaps += static_cast<int>(only_got.size());
          num_kept += k;
          std::printf("PARITY top_keys_by_logits_max_over_heads %-20s seq %zu keys %-6d k %-6d swaps %zu\n",
                      c.name.c_str(), s, num_keys, k, only_got.size());
        }
      }
    }
  }
  EXPECT_LE(num_swaps * 1000, num_kept) << "swaps only at near-ties";
}

// OmniKV's sparse-layer lists: the shared index, then each head's tail, with ragged heads.
TEST(CudaAttentionLogitsMaxOverHeadsTest, TokenListsWithTailMatchCpu) {
  SE_SKIP_WITHOUT_CUDA_DEVICE();
  const PagedCase c{"ps16 d128 skewed heads", 16, 8, 4, 128, {{3000, 1}, {700, 1}}, 0, 0.0f, 9};
  PagedCacheFixture cache(c, 9900);
  std::mt19937_64 rng(9901);
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    const auto seq = static_cast<int32_t>(s);
    const int32_t tail_begin = cache.shortest_stream(s) - 3;
    std::vector<int32_t> tokens;
    for (int32_t j = 0; j < tail_begin; ++j)
      if (rng() % 5 == 0) tokens.push_back(j);
    const auto k = static_cast<int64_t>(tokens.size());
    const int32_t* lengths = cache.cpu_view().seqs[seq].num_tokens;
    const int64_t stride = k + *std::max_element(lengths, lengths + c.num_kv_heads) - tail_begin + 5;
    Tensor tokens_host = Tensor::empty(DType::kI32, {k});
    std::copy(tokens.begin(), tokens.end(), tokens_host.data<int32_t>());
    Tensor ref_lists = Tensor::empty(DType::kI32, {c.num_kv_heads, stride});
    Tensor ref_counts = Tensor::empty(DType::kI32, {c.num_kv_heads});
    token_lists_with_tail(ref_lists.view(), ref_counts.view(), tokens_host.view(), cache.cpu_view(), seq, tail_begin);
    const Tensor tokens_dev = cuda::to_device(tokens_host);
    Tensor lists = poisoned(DType::kI32, {c.num_kv_heads, stride});
    Tensor counts = poisoned(DType::kI32, {c.num_kv_heads});
    token_lists_with_tail(lists.view(), counts.view(), tokens_dev.view(), cache.host_tables_gpu_view(), seq,
                          tail_begin);
    const Tensor got_lists = cuda::to_host(lists), got_counts = cuda::to_host(counts);
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      const int32_t count = ref_counts.data<int32_t>()[h];
      ASSERT_EQ(got_counts.data<int32_t>()[h], count) << "head " << h;
      ASSERT_EQ(count, k + lengths[h] - tail_begin) << "head " << h;
      const int32_t* want = ref_lists.data<int32_t>() + h * stride;
      EXPECT_TRUE(std::equal(want, want + count, got_lists.data<int32_t>() + h * stride)) << "head " << h;
    }
    std::printf("PARITY token_lists_with_tail %-24s seq %zu index %lld\n", c.name.c_str(), s,
                static_cast<long long>(k));
  }
}

}  // namespace
}  // namespace se
