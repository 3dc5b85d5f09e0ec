// FP8 conversions at the points that define them (the exhaustive comparison with ml_dtypes is
// tests/sparse/test_quant_oracles.py).
#include "tensor/fp8.h"

#include <cmath>

#include <gtest/gtest.h>

namespace se {
namespace {

TEST(Fp8, E4m3RangeAndSaturation) {
  EXPECT_EQ(fp8_max_finite(Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(f32_to_fp8_satfinite(448.0f, Fp8Format::kE4M3), 0x7e);
  EXPECT_EQ(f32_to_fp8_satfinite(465.0f, Fp8Format::kE4M3), 0x7e);  // would round to 480: saturates
  EXPECT_EQ(f32_to_fp8_satfinite(-INFINITY, Fp8Format::kE4M3), 0xfe);
  EXPECT_TRUE(std::isnan(fp8_to_f32(f32_to_fp8_satfinite(NAN, Fp8Format::kE4M3), Fp8Format::kE4M3)));
  EXPECT_EQ(fp8_to_f32(0x01, Fp8Format::kE4M3), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(Fp8, RoundsTiesToEven) {
  // 1.0625 lies halfway between 1.0 (even mantissa) and 1.125 in e4m3; 1.1875 between 1.125 and 1.25 (even).
  EXPECT_EQ(fp8_to_f32(f32_to_fp8_satfinite(1.0625f, Fp8Format::kE4M3), Fp8Format::kE4M3), 1.0f);
  EXPECT_EQ(fp8_to_f32(f32_to_fp8_satfinite(1.1875f, Fp8Format::kE4M3), Fp8Format::kE4M3), 1.25f);
  // Half the smallest subnormal rounds to zero (even), a bit more to the subnormal.
  EXPECT_EQ(f32_to_fp8_satfinite(std::ldexp(1.0f, -10), Fp8Format::kE4M3), 0x00);
  EXPECT_EQ(f32_to_fp8_satfinite(std::ldexp(1.01f, -10), Fp8Format::kE4M3), 0x01);
}

TEST(Fp8, E5m2KeepsInfinityOnReadAndSaturatesOnWrite) {
  EXPECT_EQ(fp8_max_finite(Fp8Format::kE5M2), 57344.0f);
  EXPECT_EQ(f32_to_fp8_satfinite(1e6f, Fp8Format::kE5M2), 0x7b);
  EXPECT_EQ(fp8_to_f32(0x7c, Fp8Format::kE5M2), INFINITY);
}

}  // namespace
}  // namespace se
