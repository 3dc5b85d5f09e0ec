// paged_low_rank_attention (Palu's fused attention over low-rank latents) against attention over the keys and values
// the latents stand for, rebuilt into explicit pages (low_rank_case.h): ragged batches of prefill chunks and decode
// rows, with and without the k/v biases and the per-head key norm (Qwen2, Qwen3), partial rotary, a sliding window
// and a logit softcap (Gemma). Bad views are refused with the field that is wrong.
#include <gtest/gtest.h>

#include "low_rank_case.h"

namespace se {
namespace {

const std::vector<test::PagedSeq> kBatch = {{5, 13}, {1, 9}, {40, 40}, {1, 1}};

double error_against_reference(const test::LowRankShape& shape, const RopeParams& rope, const AttentionParams& params,
                               uint64_t seed) {
  const test::LowRankCase c(shape, kBatch, seed, [](float x) { return x; });
  const Tensor want = c.reference(rope, params);
  Tensor got = Tensor::empty(DType::kF32, {c.total_rows(), shape.heads(), shape.head_dim});
  std::fill_n(got.data<float>(), got.numel(), std::nanf(""));
  paged_low_rank_attention(got.view(), c.q.view(), c.view(), rope, params);
  std::vector<double> ref(want.data<float>(), want.data<float>() + want.numel());
  return test::relative_error(got.data<float>(), ref.data(), got.numel());
}

TEST(LowRankAttentionTest, MatchesAttentionOverTheRebuiltKeysAndValues) {
  RopeParams rope;
  rope.rotary_dim = 16;
  AttentionParams params;
  params.scale = 0.25f;
  test::LowRankShape shape;
  EXPECT_LT(error_against_reference(shape, rope, params, 1), 1e-5);
  shape.bias = shape.k_norm = false;
  EXPECT_LT(error_against_reference(shape, rope, params, 2), 1e-5);
  // One group of every KV head, ranks above head_dim (a group's rank counts all its heads' rows), four queries per
  // KV head.
  shape = {.groups = 1, .group_heads = 3, .head_dim = 16, .k_rank = 24, .v_rank = 20, .queries_per_kv = 4};
  EXPECT_LT(error_against_reference(shape, rope, params, 3), 1e-5);
}

TEST(LowRankAttentionTest, PartialRotaryWindowAndSoftcap) {
  RopeParams rope;
  rope.rotary_dim = 8;
  rope.theta = 500.0f;
  AttentionParams params;
  params.scale = 0.3f;
  params.sliding_window = 6;
  params.logit_softcap = 5.0f;
  EXPECT_LT(error_against_reference(test::LowRankShape{}, rope, params, 4), 1e-5);
}

TEST(LowRankAttentionTest, RefusesViewsItCannotRead) {
  const test::LowRankShape shape;
  const test::LowRankCase c(shape, kBatch, 5, [](float x) { return x; });
  RopeParams rope;
  rope.rotary_dim = 16;
  Tensor out = Tensor::empty(DType::kF32, {c.total_rows(), shape.heads(), shape.head_dim});
  AttentionView view = c.view();
  view.head_dim = shape.width() + 1;  // the rows are not k_rank + v_rank wide
  EXPECT_DEATH(paged_low_rank_attention(out.view(), c.q.view(), view, rope, {}), "latent rows of 13 values");
  view = c.view();
  view.payload = KvPayload::kExplicit;
  EXPECT_DEATH(paged_low_rank_attention(out.view(), c.q.view(), view, rope, {}), "low-rank latent store");
  view = c.view();
  view.has_selection = true;
  EXPECT_DEATH(paged_low_rank_attention(out.view(), c.q.view(), view, rope, {}), "no selection");
  rope.rotary_dim = 18;
  EXPECT_DEATH(paged_low_rank_attention(out.view(), c.q.view(), c.view(), rope, {}), "rotary_dim 18");
}

}  // namespace
}  // namespace se
