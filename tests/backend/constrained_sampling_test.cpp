// The constrained-decoding ops on the CPU: mask_refused_tokens keeps exactly the allowed bits' logits (rows wider
// than a multiple of 64 included), and token_logprobs is the log-softmax at each row's id.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "op_test_util.h"

namespace se {
namespace {

TEST(ConstrainedSamplingTest, MaskKeepsAllowedLogitsOnly) {
  const int64_t rows = 3, width = 130, words = 3;
  Tensor x = test::random_tensor({rows, width}, 5);
  Tensor allowed = Tensor::empty(DType::kI64, {rows, words});
  std::mt19937_64 rng(11);
  auto* bits = reinterpret_cast<uint64_t*>(allowed.data<int64_t>());
  for (int64_t i = 0; i < rows * words; ++i) bits[i] = rng();
  Tensor out = Tensor::empty(DType::kF32, {rows, width});
  mask_refused_tokens(out.view(), x.view(), allowed.view());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) {
      const float got = out.data<float>()[r * width + i];
      if ((bits[r * words + i / 64] >> (i % 64)) & 1)
        EXPECT_EQ(got, x.data<float>()[r * width + i]) << r << " " << i;
      else
        EXPECT_TRUE(std::isinf(got) && got < 0) << r << " " << i;
    }
}

TEST(ConstrainedSamplingTest, TokenLogprobIsTheLogSoftmaxAtTheId) {
  const int64_t rows = 2, width = 50;
  Tensor x = test::random_tensor({rows, width}, 6, 3.0f);
  Tensor ids = Tensor::empty(DType::kI32, {rows});
  ids.data<int32_t>()[0] = 0;
  ids.data<int32_t>()[1] = 49;
  Tensor logprobs = Tensor::empty(DType::kF32, {rows});
  token_logprobs(logprobs.view(), x.view(), ids.view());
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t i = 0; i < width; ++i) sum += std::exp(static_cast<double>(x.data<float>()[r * width + i]));
    const double want = x.data<float>()[r * width + ids.data<int32_t>()[r]] - std::log(sum);
    EXPECT_NEAR(logprobs.data<float>()[r], want, 1e-5) << r;
  }
}

TEST(ConstrainedSamplingDeathTest, RefusesIdsOutsideTheRow) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor x = test::random_tensor({1, 8}, 7);
  Tensor ids = Tensor::empty(DType::kI32, {1});
  ids.data<int32_t>()[0] = 8;
  Tensor logprobs = Tensor::empty(DType::kF32, {1});
  EXPECT_DEATH(token_logprobs(logprobs.view(), x.view(), ids.view()), "token_logprobs: id 8 of row 0");
}

}  // namespace
}  // namespace se
