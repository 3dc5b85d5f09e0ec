#include "tensor/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace se {
namespace {

TEST(DTypeTest, F16RoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float f = f16_to_f32(half);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), half) << "half bits " << h;
  }
}

TEST(DTypeTest, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway above max rounds to inf
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // halfway to zero: even
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);
}

// Any float, not only the halves' own values and the hand-picked ties above: the half it rounds to is the nearest
// one (the even one on a tie), and past the largest half (65520 and up) it is infinity.
TEST(DTypeTest, F16IsTheNearestHalfOfRandomFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    const uint16_t h = f32_to_f16(f);
    const float magnitude = std::fabs(f);
    if (magnitude >= 65520.0f) {
      EXPECT_EQ(h & 0x7fffu, 0x7c00u) << f;
      continue;
    }
    const double error = std::fabs(static_cast<double>(f16_to_f32(h)) - f);
    for (const int step : {-1, 1}) {
      const int neighbor_magnitude = static_cast<int>(h & 0x7fffu) + step;
      if (neighbor_magnitude < 0 || neighbor_magnitude > 0x7bff) continue;
      const auto neighbor = static_cast<uint16_t>((h & 0x8000u) | static_cast<uint32_t>(neighbor_magnitude));
      const double neighbor_error = std::fabs(static_cast<double>(f16_to_f32(neighbor)) - f);
      EXPECT_TRUE(error < neighbor_error || (error == neighbor_error && (h & 1u) == 0)) << f << " -> " << h;
    }
  }
}

TEST(DTypeTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace se
