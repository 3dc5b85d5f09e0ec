#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "op_test_util.h"

namespace se {
namespace {

// Every batch height of the streamed decode path (1 to 8 rows in one pass over W, 12 and 16 in two) and OpenBLAS's
// GEMM beyond it.
TEST(LinearTest, MatchesFloat64ReferenceWithBias) {
  for (const auto [rows, cols] : {std::pair<int64_t, int64_t>{19, 33}, {131, 576}, {64, 1000}, {3, 7}}) {
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17}) {
      Tensor x = test::random_tensor({m, cols}, 1);
      Tensor w = test::random_tensor({rows, cols}, 2);
      Tensor b = test::random_tensor({rows}, 3);
      Tensor y = Tensor::empty(DType::kF32, {m, rows});
      TensorView bias = b.view();
      linear(y.view(), x.view(), w.view(), &bias);
      std::vector<double> ref(static_cast<size_t>(m * rows));
      for (int64_t r = 0; r < m; ++r)
        for (int64_t n = 0; n < rows; ++n) {
          double s = b.data<float>()[n];
          for (int64_t k = 0; k < cols; ++k)
            s += static_cast<double>(x.data<float>()[r * cols + k]) * w.data<float>()[n * cols + k];
          ref[static_cast<size_t>(r * rows + n)] = s;
        }
      EXPECT_LT(test::relative_error(y.data<float>(), ref.data(), y.numel()), 1e-6) << rows << "x" << cols << " m " << m;
    }
  }
}

TEST(NormTest, RmsNormAndFusedResidualAdd) {
  Tensor x = test::random_tensor({3, 10}, 4);
  Tensor w = test::random_tensor({10}, 5);
  Tensor res = test::random_tensor({3, 10}, 6);
  Tensor res_before = res.clone();
  Tensor out = Tensor::empty(DType::kF32, {3, 10});
  add_rms_norm(out.view(), res.view(), x.view(), w.view(), 1e-6f);
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 10; ++i) {
      const double s = res_before.data<float>()[r * 10 + i] + x.data<float>()[r * 10 + i];
      EXPECT_FLOAT_EQ(res.data<float>()[r * 10 + i], static_cast<float>(s));
      ss += s * s;
    }
    const double inv = 1.0 / std::sqrt(ss / 10 + 1e-6);
    for (int i = 0; i < 10; ++i)
      EXPECT_NEAR(out.data<float>()[r * 10 + i], res.data<float>()[r * 10 + i] * inv * w.data<float>()[i], 1e-5);
  }
}

TEST(ActivationTest, GatedSiluAndGelu) {
  Tensor gu = test::random_tensor({2, 8}, 7);
  Tensor out = Tensor::empty(DType::kF32, {2, 4});
  gated_activation(out.view(), gu.view(), Activation::kSilu);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 4; ++i) {
      const double g = gu.data<float>()[r * 8 + i], u = gu.data<float>()[r * 8 + 4 + i];
      EXPECT_NEAR(out.data<float>()[r * 4 + i], g / (1 + std::exp(-g)) * u, 1e-5);
    }
  gated_activation(out.view(), gu.view(), Activation::kGeluTanh);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 4; ++i) {
      const double g = gu.data<float>()[r * 8 + i], u = gu.data<float>()[r * 8 + 4 + i];
      const double gelu = 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
      EXPECT_NEAR(out.data<float>()[r * 4 + i], gelu * u, 1e-5);
    }
}

// linear_add adds the projection into out, on the streamed decode path (1, 5 and 11 rows) and through GEMM (20).
TEST(LinearAddTest, AddsTheProjectionToOut) {
  for (int64_t m : {1, 5, 11, 20}) {
    const Tensor x = test::random_tensor({m, 70}, 21);
    const Tensor w = test::random_tensor({33, 70}, 22);
    const Tensor residual = test::random_tensor({m, 33}, 23);
    Tensor want = Tensor::empty(DType::kF32, {m, 33});
    linear(want.view(), x.view(), w.view());
    add_inplace(want.view(), residual.view());
    Tensor got = residual.clone();
    linear_add(got.view(), x.view(), w.view());
    for (int64_t i = 0; i < want.numel(); ++i)
      EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f * (1.0f + std::abs(want.data<float>()[i])))
          << "m " << m << " element " << i;
  }
}

}  // namespace
}  // namespace se
