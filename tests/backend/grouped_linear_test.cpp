// grouped_linear over block-scaled FP8 experts (backend/moe_ops.h) on the CPU: the codes and scales as stored give
// exactly what the same GEMM gives over the weights dequantized at load (fp8 code * block scale in fp32), for a
// ragged grouping (an expert with no rows, one with several) and blocks narrower than the matrix; scales that do not
// tile the weight are refused.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/moe_ops.h"
#include "fp8_experts.h"
#include "op_test_util.h"

namespace se {
namespace {

TEST(GroupedLinearTest, Fp8ExpertsGiveTheDequantizedWeightsResult) {
  constexpr int64_t kExperts = 4, kN = 64, kK = 96, kBlock = 32;
  const test::Fp8Experts w = test::random_fp8_experts(kExperts, kN, kK, kBlock, 3);
  // Rows per expert: 3, 0, 1, 4.
  Tensor offsets = Tensor::empty(DType::kI32, {kExperts + 1});
  const int32_t bounds[] = {0, 3, 3, 4, 8};
  std::memcpy(offsets.raw(), bounds, sizeof(bounds));
  const Tensor x = test::random_tensor({8, kK}, 5);
  Tensor want = Tensor::empty(DType::kF32, {8, kN}), got = Tensor::empty(DType::kF32, {8, kN});
  grouped_linear(want.view(), x.view(), w.dequantized.view(), offsets.view(), 8);
  grouped_linear(got.view(), x.view(), w.codes.view(), offsets.view(), 8, w.scales.view());
  EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));
  // A wrong scale changes the result (the scales are read, and per block).
  Tensor scales = w.scales.clone();
  scales.data<float>()[(2 * (kN / kBlock) + 1) * (kK / kBlock) + 2] *= 2.0f;  // expert 2, row block 1, col block 2
  grouped_linear(got.view(), x.view(), w.codes.view(), offsets.view(), 8, scales.view());
  EXPECT_NE(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));
}

TEST(GroupedLinearTest, RefusesScalesThatDoNotTileTheWeight) {
  const test::Fp8Experts w = test::random_fp8_experts(2, 64, 64, 32, 7);
  Tensor offsets = Tensor::empty(DType::kI32, {3});
  const int32_t bounds[] = {0, 1, 2};
  std::memcpy(offsets.raw(), bounds, sizeof(bounds));
  const Tensor x = test::random_tensor({2, 64}, 9);
  Tensor out = Tensor::empty(DType::kF32, {2, 64});
  const Tensor blocks_of_16 = Tensor::empty(DType::kF32, {2, 4, 4});
  EXPECT_DEATH(grouped_linear(out.view(), x.view(), w.codes.view(), offsets.view(), 2, blocks_of_16.view()),
               "multiples of 32");
  EXPECT_DEATH(grouped_linear(out.view(), x.view(), w.codes.view(), offsets.view(), 2), "come with their scales");
}

}  // namespace
}  // namespace se
