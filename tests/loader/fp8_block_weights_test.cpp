// The block-scaled FP8 weight format: the scale grid of 2-D and stacked weights (partial edge blocks included),
// dequantization that multiplies each element by its own block's scale, the writer's round trip (each block's
// largest magnitude lands on e4m3's 448), bad scales and unsupported quantization configs as errors.
#include "loader/fp8_block_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace se {
namespace {

constexpr uint8_t kE4m3One = 0x38;  // sign 0, exponent 7 (bias 7), mantissa 0

Fp8BlockQuantization blocks(int64_t rows, int64_t cols) { return Fp8BlockQuantization{rows, cols, {}}; }

TEST(Fp8BlockWeightsTest, ScaleGridCoversPartialBlocks) {
  EXPECT_EQ(fp8_block_scale_shape(Shape{300, 130}, blocks(128, 128)), (Shape{3, 2}));
  EXPECT_EQ(fp8_block_scale_shape(Shape{256, 128}, blocks(128, 128)), (Shape{2, 1}));
  EXPECT_EQ(fp8_block_scale_shape(Shape{4, 300, 130}, blocks(128, 64)), (Shape{4, 3, 3}));
  EXPECT_EQ(fp8_scale_name("model.layers.0.mlp.down_proj.weight"), "model.layers.0.mlp.down_proj.weight_scale_inv");
}

TEST(Fp8BlockWeightsTest, EachElementTakesItsOwnBlocksScale) {
  // Two stacked [5, 7] matrices in blocks of 2 x 3: every code reads 1.0, so the weight is the scale grid itself.
  const Fp8BlockQuantization q = blocks(2, 3);
  const Shape shape{2, 5, 7};
  std::vector<uint8_t> codes(static_cast<size_t>(shape.numel()), kE4m3One);
  Tensor scale = Tensor::empty(DType::kF32, fp8_block_scale_shape(shape, q));  // [2, 3, 3]
  for (int64_t i = 0; i < scale.numel(); ++i) scale.data<float>()[i] = 0.5f + static_cast<float>(i);
  auto w = dequantize_fp8_blocks(codes.data(), shape, scale, q, "w_scale_inv");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  for (int64_t m = 0; m < 2; ++m)
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t c = 0; c < 7; ++c)
        EXPECT_EQ(w->data<float>()[(m * 5 + r) * 7 + c], scale.data<float>()[(m * 3 + r / 2) * 3 + c / 3])
            << m << " " << r << " " << c;
}

TEST(Fp8BlockWeightsTest, QuantizeRoundTripsWithinE4m3Precision) {
  const Fp8BlockQuantization q = blocks(16, 24);
  Tensor w = Tensor::empty(DType::kF32, {3, 40, 50});
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = normal(rng);
  for (int64_t c = 0; c < 50; ++c) w.data<float>()[c] = 0.0f;  // zeros read back as zeros
  const Fp8BlockWeight stored = quantize_fp8_blocks(w, q);
  ASSERT_EQ(stored.scale_inv.shape(), (Shape{3, 3, 3}));
  auto back = dequantize_fp8_blocks(stored.codes.data<uint8_t>(), w.shape(), stored.scale_inv, q, "s");
  ASSERT_TRUE(back.is_ok());
  std::vector<float> block_max(static_cast<size_t>(stored.scale_inv.numel()), 0.0f);
  for (int64_t m = 0; m < 3; ++m)
    for (int64_t r = 0; r < 40; ++r)
      for (int64_t c = 0; c < 50; ++c) {
        const int64_t i = (m * 40 + r) * 50 + c, b = (m * 3 + r / 16) * 3 + c / 24;
        const float s = stored.scale_inv.data<float>()[b];
        // e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of the value, or of the smallest normal near zero.
        EXPECT_LE(std::fabs(back->data<float>()[i] - w.data<float>()[i]),
                  std::fmax(std::fabs(w.data<float>()[i]) / 16.0f, s * std::ldexp(1.0f, -10)))
            << i;
        block_max[static_cast<size_t>(b)] = std::fmax(block_max[static_cast<size_t>(b)], std::fabs(w.data<float>()[i]));
      }
  for (size_t b = 0; b < block_max.size(); ++b)
    EXPECT_FLOAT_EQ(stored.scale_inv.data<float>()[b], block_max[b] / 448.0f) << b;
}

TEST(Fp8BlockWeightsTest, BadScalesAreErrorsNamingThem) {
  const Fp8BlockQuantization q = blocks(128, 128);
  std::vector<uint8_t> codes(300 * 130, kE4m3One);
  const auto misshaped =
      dequantize_fp8_blocks(codes.data(), Shape{300, 130}, Tensor::zeros(DType::kF32, {2, 2}), q, "x.weight_scale_inv");
  ASSERT_FALSE(misshaped.is_ok());
  EXPECT_NE(misshaped.status().message().find("x.weight_scale_inv"), std::string::npos);
  EXPECT_NE(misshaped.status().message().find("3, 2"), std::string::npos) << misshaped.status().to_string();
  const auto integer =
      dequantize_fp8_blocks(codes.data(), Shape{300, 130}, Tensor::zeros(DType::kI32, {3, 2}), q, "y.weight_scale_inv");
  ASSERT_FALSE(integer.is_ok());
  EXPECT_NE(integer.status().message().find("y.weight_scale_inv"), std::string::npos);
  const auto vector = dequantize_fp8_blocks(codes.data(), Shape{130}, Tensor::zeros(DType::kF32, {2}), q, "z");
  EXPECT_FALSE(vector.is_ok());
}

TEST(Fp8BlockWeightsTest, ReadsTheQuantizationConfig) {
  auto none = fp8_block_quantization(nlohmann::json{{"model_type", "qwen3"}}, "config.json");
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->has_value());
  const nlohmann::json fp8 = {{"quant_method", "fp8"},
                              {"fmt", "e4m3"},
                              {"weight_block_size", {128, 64}},
                              {"modules_to_not_convert", {"model.layers.0.mlp.gate"}}};
  auto q = fp8_block_quantization(nlohmann::json{{"quantization_config", fp8}}, "config.json");
  ASSERT_TRUE(q.is_ok() && q->has_value()) << q.status().to_string();
  EXPECT_EQ((*q)->block_rows, 128);
  EXPECT_EQ((*q)->block_cols, 64);
  EXPECT_FALSE(fp8_quantizes(**q, "model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(fp8_quantizes(**q, "lm_head.weight"));
  EXPECT_TRUE(fp8_quantizes(**q, "model.layers.1.mlp.experts.3.up_proj.weight"));
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"quant_method", "awq"},
                                                           {"quant_method", 8},
                                                           {"fmt", "e5m2"},
                                                           {"weight_block_size", {128}},
                                                           {"weight_block_size", {0, 128}},
                                                           {"weight_block_size", nullptr},
                                                           {"modules_to_not_convert", "lm_head"}}) {
    nlohmann::json bad = fp8;
    bad[key] = value;
    auto r = fp8_block_quantization(nlohmann::json{{"quantization_config", bad}}, "m/config.json");
    ASSERT_FALSE(r.is_ok()) << key << " " << value.dump();
    EXPECT_NE(r.status().message().find("m/config.json"), std::string::npos) << r.status().to_string();
  }
}

}  // namespace
}  // namespace se
