#include "loader/gguf_dequant.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "gguf_builder.h"
#include "tensor/dtype.h"

namespace se {
namespace {

using testing::GgufBuilder;

std::vector<uint8_t> q8_0_block(float d, int8_t first) {
  std::vector<uint8_t> b(34, 0);
  const uint16_t h = f32_to_f16(d);
  std::memcpy(b.data(), &h, 2);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(first + j));
  return b;
}

TEST(GgufDequantTest, Q8_0KnownValues) {
  std::vector<uint8_t> b = q8_0_block(0.5f, -3);
  float y[32];
  dequantize_blocks(GgmlType::kQ8_0, b.data(), y, 1);
  EXPECT_EQ(y[0], -1.5f);
  EXPECT_EQ(y[3], 0.0f);
  EXPECT_EQ(y[31], 14.0f);
}

TEST(GgufDequantTest, Q4_0NibbleOrder) {
  // Low nibbles are elements 0..15, high nibbles 16..31; values are (q - 8) * d.
  std::vector<uint8_t> b(18, 0);
  const uint16_t h = f32_to_f16(2.0f);
  std::memcpy(b.data(), &h, 2);
  b[2] = 0xF1;  // element 0: 1, element 16: 15
  float y[32];
  dequantize_blocks(GgmlType::kQ4_0, b.data(), y, 1);
  EXPECT_EQ(y[0], -14.0f);
  EXPECT_EQ(y[16], 14.0f);
  EXPECT_EQ(y[1], -16.0f);
}

TEST(GgufDequantTest, TensorShapeIsReversedGgmlDims) {
  std::vector<uint8_t> bytes;
  for (int r = 0; r < 3; ++r) {
    std::vector<uint8_t> b = q8_0_block(1.0f, static_cast<int8_t>(r * 10));
    bytes.insert(bytes.end(), b.begin(), b.end());
  }
  GgufBuilder builder;
  builder.add_tensor("w", GgmlType::kQ8_0, {32, 3}, bytes);
  std::vector<uint8_t> file_bytes = builder.build();
  auto owned = std::make_shared<std::vector<uint8_t>>(file_bytes);
  auto file = GgufFile::parse(owned, {owned->data(), owned->size()}, "t.gguf");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  auto t = dequantize_tensor(file->tensors()[0]);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->shape(), (Shape{3, 32}));
  EXPECT_EQ(t->dtype(), DType::kF32);
  EXPECT_EQ(t->data<float>()[2 * 32 + 1], 21.0f);  // row 2, column 1
}

TEST(GgufDequantTest, ParallelChunksMatchSerial) {
  // Enough Q4_K blocks for several OpenMP chunks.
  const int64_t num_blocks = 3 * 4096 + 17;
  std::vector<uint8_t> raw(static_cast<size_t>(num_blocks) * 144);
  std::mt19937 rng(7);
  for (auto& v : raw) v = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < num_blocks; ++i) {
    const uint16_t d = f32_to_f16(0.01f), dmin = f32_to_f16(0.02f);
    std::memcpy(&raw[i * 144], &d, 2);
    std::memcpy(&raw[i * 144 + 2], &dmin, 2);
  }
  GgufTensorInfo info;
  info.name = "big";
  info.type = GgmlType::kQ4_K;
  info.dims = {256, num_blocks};
  info.nbytes = raw.size();
  info.data = raw.data();
  auto t = dequantize_tensor(info);
  ASSERT_TRUE(t.is_ok());
  std::vector<float> serial(static_cast<size_t>(num_blocks) * 256);
  dequantize_blocks(GgmlType::kQ4_K, raw.data(), serial.data(), num_blocks);
  EXPECT_EQ(std::memcmp(serial.data(), t->raw(), serial.size() * 4), 0);
}

TEST(GgufDequantTest, UnsupportedTypeNamesTensorAndType) {
  std::vector<uint8_t> raw(66);
  GgufTensorInfo info;
  info.name = "blk.0.ffn_up.weight";
  info.type = GgmlType::kIQ2_XXS;
  info.dims = {256};
  info.data = raw.data();
  auto t = dequantize_tensor(info);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("blk.0.ffn_up.weight"), std::string::npos);
  EXPECT_NE(t.status().message().find("IQ2_XXS"), std::string::npos);
  EXPECT_FALSE(can_dequantize(GgmlType::kQ2_K));
  EXPECT_TRUE(can_dequantize(GgmlType::kQ6_K));
}

}  // namespace
}  // namespace se
