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

// The inverse frequencies of `p` next to those of the same rotation unscaled.
struct Frequencies {
  std::vector<float> plain, scaled;
};
Frequencies frequencies(const RopeParams& p) {
  RopeParams unscaled;
  unscaled.theta = p.theta;
  unscaled.rotary_dim = p.rotary_dim;
  Frequencies f{std::vector<float>(static_cast<size_t>(p.rotary_dim / 2)),
                std::vector<float>(static_cast<size_t>(p.rotary_dim / 2))};
  cpu::rope_inv_freq(unscaled, f.plain.data());
  cpu::rope_inv_freq(p, f.scaled.data());
  return f;
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
  p.scaling = RopeScaling::kLlama3;
  p.factor = 8.0f;
  p.low_freq_factor = 1.0f;
  p.high_freq_factor = 4.0f;
  p.original_max_position = 8192;
  const auto [plain, scaled] = frequencies(p);
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

// Qwen3's YaRN (theta 1e6, 128 rotary dims, factor 4 over 32,768 trained positions): the dimensions below the
// band where a wavelength fits 32 times into the trained context keep their frequency, those past the band where it
// fits once are divided by the factor, and the band between blends the two, monotonically.
TEST(RopeTest, YarnKeepsFastDimensionsAndInterpolatesSlowOnes) {
  RopeParams p;
  p.theta = 1e6f;
  p.rotary_dim = 128;
  p.scaling = RopeScaling::kYarn;
  p.factor = 4.0f;
  p.original_max_position = 32768;
  const auto [plain, scaled] = frequencies(p);
  const auto band_edge = [](double rotations) {
    return 128 * std::log(32768 / (rotations * 2 * std::numbers::pi)) / (2 * std::log(1e6));
  };
  const int low = static_cast<int>(std::floor(band_edge(32))), high = static_cast<int>(std::ceil(band_edge(1)));
  ASSERT_GT(low, 0);
  ASSERT_LT(high, 63);
  double last_share = 0;
  for (int i = 0; i < 64; ++i) {
    if (i <= low) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i]) << i;
    } else if (i >= high) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i] / 4.0f) << i;
    } else {
      const double share = (plain[i] - static_cast<double>(scaled[i])) / (plain[i] * 0.75);  // interpolated part
      EXPECT_NEAR(share, static_cast<double>(i - low) / (high - low), 1e-5) << i;
      EXPECT_GT(share, last_share) << i;
      last_share = share;
    }
  }
}

// YaRN's attention factor scales cos and sin: at position 0 the rotated dimensions come out multiplied by it and the
// rest of a partially rotated head passes untouched.
TEST(RopeTest, YarnAttentionFactorScalesOnlyTheRotatedDimensions) {
  RopeParams p;
  p.theta = 10000.0f;
  p.rotary_dim = 32;
  p.scaling = RopeScaling::kYarn;
  p.factor = 4.0f;
  p.original_max_position = 2048;
  p.attention_factor = 1.25f;
  const Tensor x = test::random_tensor({1, 2, 64}, 3);
  Tensor y = x.clone();
  int32_t position = 0;
  rope(y.view(), TensorView{&position, DType::kI32, {1}}, p);
  for (int i = 0; i < 128; ++i)
    EXPECT_FLOAT_EQ(y.data<float>()[i], x.data<float>()[i] * (i % 64 < 32 ? 1.25f : 1.0f)) << i;
}

// split_qkv_rope against the formulas written out here: each head of the fused row lands in its output, q and k
// heads are RMS-normed (x / sqrt(mean(x^2) + eps) * w) and rotated (NeoX pairs i, i + rotary_dim / 2; the angle is
// the fp32 product position * inv_freq, inv_freq = theta^(-2i / rotary_dim)), v is copied untouched.
TEST(SplitQkvRopeTest, MatchesTheFormulas) {
  const int T = 3, Hq = 4, Hk = 2, D = 16, heads = Hq + 2 * Hk;
  const Tensor qkv = test::random_tensor({T, heads * D}, 7);
  const Tensor q_weight = test::random_tensor({D}, 8), k_weight = test::random_tensor({D}, 9);
  std::vector<int32_t> pos = {0, 5, 4099};
  const TensorView positions{pos.data(), DType::kI32, {T}};
  RopeParams p;
  p.theta = 500000.0f;
  p.rotary_dim = D / 2;  // a partial rotation: the upper half of each head passes through
  const int half = p.rotary_dim / 2;
  for (bool with_norm : {false, true}) {
    Tensor q = Tensor::empty(DType::kF32, {T, Hq, D}), k = Tensor::empty(DType::kF32, {T, Hk, D}),
           v = Tensor::empty(DType::kF32, {T, Hk, D});
    const QkNorm norm{q_weight.view(), k_weight.view(), 1e-6f};
    split_qkv_rope(q.view(), k.view(), v.view(), qkv.view(), positions, p, with_norm ? &norm : nullptr);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < heads; ++h) {
        std::vector<double> x(qkv.data<float>() + (t * heads + h) * D, qkv.data<float>() + (t * heads + h + 1) * D);
        const bool is_v = h >= Hq + Hk;
        if (!is_v && with_norm) {
          double sum_sq = 0;
          for (double e : x) sum_sq += e * e;
          const float* w = (h < Hq ? q_weight : k_weight).data<float>();
          for (int i = 0; i < D; ++i) x[static_cast<size_t>(i)] *= w[i] / std::sqrt(sum_sq / D + 1e-6);
        }
        std::vector<double> want = x;
        if (!is_v) {
          for (int i = 0; i < half; ++i) {
            const auto inv_freq = static_cast<float>(std::pow(500000.0, -2.0 * i / p.rotary_dim));
            const double angle = static_cast<float>(pos[static_cast<size_t>(t)]) * inv_freq;
            const double a = x[static_cast<size_t>(i)], b = x[static_cast<size_t>(i + half)];
            want[static_cast<size_t>(i)] = a * std::cos(angle) - b * std::sin(angle);
            want[static_cast<size_t>(i + half)] = b * std::cos(angle) + a * std::sin(angle);
          }
        }
        const float* got = h < Hq        ? q.data<float>() + (t * Hq + h) * D
                            : h < Hq + Hk ? k.data<float>() + (t * Hk + h - Hq) * D
                                          : v.data<float>() + (t * Hk + h - Hq - Hk) * D;
        for (int i = 0; i < D; ++i)
          EXPECT_NEAR(got[i], want[static_cast<size_t>(i)], 1e-5 * (1 + std::abs(want[static_cast<size_t>(i)])))
              << "norm " << with_norm << " token " << t << " head " << h << " element " << i;
      }
  }
}

}  // namespace
}  // namespace se
