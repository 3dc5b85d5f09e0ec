// What the architectures do to their own weights on the way to the canonical layout: llama.cpp's Q/K row order
// undone (Llama), the norm multiplier 1 + w (Gemma).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../loader/safetensors_builder.h"
#include "loader/weight_transforms.h"
#include "model/arch/gemma3.h"
#include "model/arch/llama.h"

namespace se {
namespace {

// convert_hf_to_gguf.py LlamaModel.permute, written out from its numpy expression:
//   w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
// so result[h, i, j] = w[h, j, i] with result viewed as [n_head, half, 2] and w as [n_head, 2,
// half].
Tensor converter_permute(const Tensor& w, int64_t n_head) {
  const int64_t rows = w.dim(0), cols = w.rank() > 1 ? w.dim(1) : 1, half = rows / n_head / 2;
  Tensor out = Tensor::empty(DType::kF32, w.shape());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t c = 0; c < cols; ++c)
          out.data<float>()[((h * half + i) * 2 + j) * cols + c] = w.data<float>()[((h * 2 + j) * half + i) * cols + c];
  return out;
}

bool equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(ArchWeightTransformsTest, UnpermuteInvertsTheConverter) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (auto [rows, heads] : {std::pair{64, 4}, std::pair{24, 3}, std::pair{8, 1}}) {
    Tensor w = Tensor::empty(DType::kF32, Shape{rows, 5});
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = normal(rng);
    Tensor gguf = converter_permute(w, heads);
    EXPECT_FALSE(equal(gguf, w)) << rows << "/" << heads;
    EXPECT_TRUE(equal(unpermute_qk_rows(gguf, heads), w)) << rows << "/" << heads;
    EXPECT_TRUE(equal(permute_qk_rows(w, heads), gguf)) << rows << "/" << heads;
  }
  // A bias (one column) follows the same row order.
  Tensor bias = testing::ramp(Shape{16});
  EXPECT_TRUE(equal(unpermute_qk_rows(converter_permute(bias, 2), 2), bias));
}

TEST(ArchWeightTransformsTest, GemmaNormMultiplier) {
  Tensor t = testing::ramp(Shape{2, 3}, -1.0f, 0.5f);
  Tensor shifted = gemma_norm_multiplier(t);
  EXPECT_EQ(shifted.dtype(), DType::kF32);
  EXPECT_EQ(shifted.data<float>()[0], 0.0f);
  EXPECT_EQ(shifted.data<float>()[5], 2.5f);
  EXPECT_EQ(t.data<float>()[0], -1.0f);  // input untouched
  EXPECT_EQ(gemma_norm_multiplier(cast_weight(t, DType::kBF16)).data<float>()[5], 2.5f);
}

}  // namespace
}  // namespace se
