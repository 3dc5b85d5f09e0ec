#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/ops.h"
#include "op_test_util.h"

namespace se {
namespace {

double dot(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

TEST(RopeTest, RotationIsRelative) {
  // <rope(q, m), rope(k, n)> depends only on m - n, and position 0 is the identity.
  const int D = 64;
  RopeParams p;
  p.theta = 10000.0f;
  p.rotary_dim = D;
  Tensor q = test::random_tensor({1, 1, D}, 1);
  Tensor k = test::random_tensor({1, 1, D}, 2);
  auto rotated = [&](const Tensor& x, int pos) {
    Tensor y = x.clone();
    int32_t position = pos;
    rope(y.view(), TensorView{&position, DType::kI32, {1}}, p);
    return y;
  };
  Tensor q0 = rotated(q, 0);
  for (int i = 0; i < D; ++i) EXPECT_EQ(q0.data<float>()[i], q.data<float>()[i]);
  const double a = dot(rotated(q, 10).data<float>(), rotated(k, 3).data<float>(), D);
  const double b = dot(rotated(q, 107).data<float>(), rotated(k, 100).data<float>(), D);
  EXPECT_NEAR(a, b, 1e-3 * std::abs(a) + 1e-3);
}

TEST(RopeTest, Llama3ScalingKeepsHighAndDividesLowFrequencies) {
  RopeParams p;
  p.theta = 500000.0f;
  p.rotary_dim = 128;
  std::vector<float> plain(64), scaled(64);
  cpu::rope_inv_freq(p, plain.data());
  p.scaling = RopeScaling::kLlama3;
  p.factor = 8.0f;
  p.low_freq_factor = 1.0f;
  p.high_freq_factor = 4.0f;
  p.original_max_position = 8192;
  cpu::rope_inv_freq(p, scaled.data());
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i]);
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i] / 8.0f);
    } else {
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 8.0f);
    }
  }
}

}  // namespace
}  // namespace se
