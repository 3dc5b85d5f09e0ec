#include <gtest/gtest.h>

#include <algorithm>
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

// split_qkv_rope: each head of the fused row lands in its output, q and k normed per head and rotated as the
// single ops would, v copied untouched; rows are independent of each other.
TEST(SplitQkvRopeTest, EqualsSplitThenNormThenRope) {
  const int T = 3, Hq = 4, Hk = 2, D = 16;
  const Tensor qkv = test::random_tensor({T, (Hq + 2 * Hk) * D}, 7);
  const Tensor q_weight = test::random_tensor({D}, 8), k_weight = test::random_tensor({D}, 9);
  std::vector<int32_t> pos = {0, 5, 4099};
  const TensorView positions{pos.data(), DType::kI32, {T}};
  RopeParams p;
  p.theta = 500000.0f;
  p.rotary_dim = D / 2;  // a partial rotation: the upper half of each head passes through
  for (bool with_norm : {false, true}) {
    Tensor q = Tensor::empty(DType::kF32, {T, Hq, D}), k = Tensor::empty(DType::kF32, {T, Hk, D}),
           v = Tensor::empty(DType::kF32, {T, Hk, D});
    const QkNorm norm{q_weight.view(), k_weight.view(), 1e-6f};
    split_qkv_rope(q.view(), k.view(), v.view(), qkv.view(), positions, p, with_norm ? &norm : nullptr);
    // The reference, head by head from the row: copy, norm, rotate.
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < Hq + 2 * Hk; ++h) {
        Tensor head = Tensor::empty(DType::kF32, {1, 1, D});
        std::copy_n(qkv.data<float>() + (t * (Hq + 2 * Hk) + h) * D, D, head.data<float>());
        const bool is_v = h >= Hq + Hk;
        if (!is_v) {
          if (with_norm) rms_norm(head.view(), head.view(), h < Hq ? q_weight.view() : k_weight.view(), 1e-6f);
          rope(head.view(), TensorView{&pos[static_cast<size_t>(t)], DType::kI32, {1}}, p);
        }
        const float* got = h < Hq        ? q.data<float>() + (t * Hq + h) * D
                            : h < Hq + Hk ? k.data<float>() + (t * Hk + h - Hq) * D
                                          : v.data<float>() + (t * Hk + h - Hq - Hk) * D;
        for (int i = 0; i < D; ++i)
          EXPECT_EQ(got[i], head.data<float>()[i]) << "norm " << with_norm << " token " << t << " head " << h
                                                   << " element " << i;
      }
  }
}

}  // namespace
}  // namespace se
