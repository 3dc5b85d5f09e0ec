// Multi-head latent attention's ops on the CPU. absorb_latent_queries then paged_latent_attention (absorbed weights
// over a shared latent store) against the float64 reference of the naive expanded form (latent_attention_case.h):
// ragged batches mix decode rows with prefill chunks (longer than one query tile), over pages scattered in the
// pool; with and without a sliding window, and over a token or page selection (what a sparse method narrows the
// latent store to). Outputs start poisoned (NaN). rope_latent_heads against rms_norm and rope applied to the
// deinterleaved heads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/ops.h"
#include "latent_attention_case.h"
#include "op_test_util.h"

namespace se {
namespace {

void check(const std::vector<test::PagedSeq>& seqs, const AttentionParams& params, uint64_t seed,
           test::LatentSelection selection = test::LatentSelection::kNone) {
  const test::LatentShape shape;
  const test::LatentCase c(shape, seqs, seed, selection, [](float x) { return x; });
  Tensor q_latent = Tensor::empty(DType::kF32, {c.total_rows(), shape.heads, shape.width()});
  absorb_latent_queries(q_latent.view(), c.q.view(), c.kv_b.view());
  Tensor out = Tensor::empty(DType::kF32, {c.total_rows(), shape.heads, shape.value});
  std::fill_n(out.data<float>(), out.numel(), std::numeric_limits<float>::quiet_NaN());
  paged_latent_attention(out.view(), q_latent.view(), c.view(), c.kv_b.view(), params);
  const std::vector<double> ref = c.expanded_reference(params);
  EXPECT_LT(test::relative_error(out.data<float>(), ref.data(), out.numel()), 1e-5);
}

TEST(PagedLatentAttentionTest, AbsorbedEqualsExpandedOnRaggedBatches) {
  AttentionParams params;
  params.scale = 1.0f / std::sqrt(14.0f);
  // Decode rows of several lengths, a short chunk, and a prefill longer than one query tile (32 rows).
  check({{1, 1}, {1, 5}, {1, 17}, {4, 33}, {40, 40}}, params, 11);
  check({{3, 3}, {1, 64}, {9, 12}}, params, 12);
}

TEST(PagedLatentAttentionTest, TokenAndPageSelection) {
  AttentionParams params;
  params.scale = 0.3f;
  check({{1, 1}, {1, 17}, {4, 33}, {40, 40}}, params, 14, test::LatentSelection::kTokens);
  check({{1, 1}, {1, 17}, {4, 33}, {1, 40}}, params, 15, test::LatentSelection::kPages);
}

TEST(PagedLatentAttentionTest, SlidingWindow) {
  AttentionParams params;
  params.scale = 0.3f;
  params.sliding_window = 7;
  check({{1, 20}, {5, 30}, {36, 36}}, params, 13);
}

TEST(PagedLatentAttentionTest, RefusesOtherPayloads) {
  const test::LatentShape shape;
  AttentionView view;
  int32_t q_indptr[2] = {0, 0};
  view.q_indptr = q_indptr;
  view.num_kv_heads = 1;
  view.head_dim = shape.width();
  const Tensor q_latent = Tensor::empty(DType::kF32, {0, shape.heads, shape.width()});
  const Tensor kv_b = Tensor::empty(DType::kF32, {shape.heads * shape.per_head(), shape.rank});
  Tensor out = Tensor::empty(DType::kF32, {0, shape.heads, shape.value});
  EXPECT_DEATH(paged_latent_attention(out.view(), q_latent.view(), view, kv_b.view(), {}), "shared latent store");
}

// Each head [first ; interleaved RoPE pairs] against the same head deinterleaved by hand, its first part through
// rms_norm and its RoPE part through rope: YaRN's scaled cos and sin included, in place as the layer calls it.
TEST(RopeLatentHeadsTest, MatchesNormAndRopeOfTheDeinterleavedHeads) {
  constexpr int64_t kTokens = 5, kHeads = 3, kFirst = 10, kRope = 8, kWidth = kFirst + kRope;
  RopeParams rope_params;
  rope_params.theta = 10000.0f;
  rope_params.rotary_dim = kRope;
  rope_params.scaling = RopeScaling::kYarn;
  rope_params.factor = 4.0f;
  rope_params.original_max_position = 64;
  rope_params.attention_factor = 1.2f;
  Tensor positions = Tensor::empty(DType::kI32, {kTokens});
  for (int64_t t = 0; t < kTokens; ++t) positions.data<int32_t>()[t] = static_cast<int32_t>(7 * t + 3);
  const Tensor x = test::random_tensor({kTokens, kHeads, kWidth}, 21);
  const Tensor weight = test::random_tensor({kFirst}, 22);
  for (const bool normed : {false, true}) {
    Tensor out = Tensor::empty(DType::kF32, {kTokens, kHeads, kWidth});
    std::copy_n(x.data<float>(), x.numel(), out.data<float>());
    const TensorView norm = weight.view();
    rope_latent_heads(out.view(), out.view(), positions.view(), rope_params, normed ? &norm : nullptr, 1e-6f);

    Tensor first = Tensor::empty(DType::kF32, {kTokens * kHeads, kFirst});
    Tensor rotated = Tensor::empty(DType::kF32, {kTokens, kHeads, kRope});
    for (int64_t i = 0; i < kTokens * kHeads; ++i) {
      const float* head = x.data<float>() + i * kWidth;
      std::copy_n(head, kFirst, first.data<float>() + i * kFirst);
      for (int64_t p = 0; p < kRope / 2; ++p) {
        rotated.data<float>()[i * kRope + p] = head[kFirst + 2 * p];
        rotated.data<float>()[i * kRope + kRope / 2 + p] = head[kFirst + 2 * p + 1];
      }
    }
    if (normed) rms_norm(first.view(), first.view(), weight.view(), 1e-6f);
    rope(rotated.view(), positions.view(), rope_params);
    for (int64_t i = 0; i < kTokens * kHeads; ++i) {
      for (int64_t d = 0; d < kFirst; ++d)
        ASSERT_FLOAT_EQ(out.data<float>()[i * kWidth + d], first.data<float>()[i * kFirst + d]) << i << " " << d;
      for (int64_t d = 0; d < kRope; ++d)
        ASSERT_FLOAT_EQ(out.data<float>()[i * kWidth + kFirst + d], rotated.data<float>()[i * kRope + d])
            << i << " " << d;
    }
  }
}

}  // namespace
}  // namespace se
