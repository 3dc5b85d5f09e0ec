#include "loader/weight_transforms.h"

#include <gtest/gtest.h>

#include <cstring>

#include "safetensors_builder.h"
#include "tensor/host_memory.h"

namespace se {
namespace {

bool equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(WeightTransformsTest, Cast) {
  Tensor t = testing::ramp(Shape{2, 3}, -1.0f, 0.5f);
  Tensor bf = cast_weight(t, DType::kBF16);
  EXPECT_EQ(bf.dtype(), DType::kBF16);
  EXPECT_TRUE(equal(cast_weight(bf, DType::kF32), t));    // these values are exact in bf16
  EXPECT_EQ(cast_weight(t, DType::kF32).raw(), t.raw());  // no copy when the dtype matches
}

// An F32 weight cast to BF16 allocates only the BF16 result (a GPU load holds the F32 weight meanwhile).
TEST(WeightTransformsTest, CastFromF32AllocatesOnlyTheResult) {
  const Tensor t = testing::ramp(Shape{64, 1024}, -1.0f, 0.001f);
  const size_t before = host_tensor_bytes();
  reset_host_tensor_peak();
  const Tensor bf = cast_weight(t, DType::kBF16);
  EXPECT_EQ(host_tensor_peak_bytes() - before, bf.nbytes());
}

}  // namespace
}  // namespace se
