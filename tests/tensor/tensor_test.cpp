#include "tensor/tensor.h"

#include <gtest/gtest.h>

namespace se {
namespace {

TEST(TensorTest, ShapesSlicesAndClones) {
  Tensor t = Tensor::empty(DType::kF32, {4, 3});
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.describe(), "f32[4, 3]");

  Tensor rows = t.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), Shape({2, 3}));
  EXPECT_EQ(rows.data<float>()[0], 3.0f);

  Tensor copy = t.clone();
  copy.data<float>()[0] = 100.0f;
  EXPECT_EQ(t.data<float>()[0], 0.0f);

  Tensor flat = t.reshape({12});
  EXPECT_EQ(flat.data<float>(), t.data<float>());
}

TEST(TensorTest, ConvertsHalfToF32) {
  Tensor h = Tensor::empty(DType::kBF16, {2});
  h.data<uint16_t>()[0] = f32_to_bf16(1.5f);
  h.data<uint16_t>()[1] = f32_to_bf16(-2.0f);
  Tensor f = h.to_f32();
  EXPECT_EQ(f.data<float>()[0], 1.5f);
  EXPECT_EQ(f.data<float>()[1], -2.0f);
}

}  // namespace
}  // namespace se
