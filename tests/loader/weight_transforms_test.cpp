#include "loader/weight_transforms.h"

#include <gtest/gtest.h>

#include <cstring>

#include "safetensors_builder.h"

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

}  // namespace
}  // namespace se
