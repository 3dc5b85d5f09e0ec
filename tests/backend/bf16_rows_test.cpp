// The bf16 row ops on the CPU: scatter_rows_to_bf16 rounds each named source row to nearest-even bf16 (the bits
// f32_to_bf16 gives) into its own destination plus the call's offset, in any buffers, and writes nothing else;
// convert widens bf16 back to F32 exactly and rounds F32 to bf16 the same way; bad source rows, tables and dtypes
// are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/ops.h"

namespace se {
namespace {

constexpr int64_t kRow = 5;

// Source rows [rows, kRow] whose values exercise the rounding: a tie to even (1 + 2^-8 rounds down, 1 + 3 * 2^-8
// up), a value that rounds up, a subnormal, a negative.
std::vector<float> source_rows(int64_t rows) {
  std::vector<float> src;
  for (int64_t r = 0; r < rows; ++r) {
    const auto s = static_cast<float>(r + 1);
    for (const float x : {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f / 3.0f, 0x1p-130f, -2.7182818f})
      src.push_back(s * x);
  }
  return src;
}

TensorView table_view(std::vector<RowDestination>& rows) {
  return TensorView{rows.data(), DType::kI64, {static_cast<int64_t>(rows.size()), 2}, Device::kCpu};
}

TEST(Bf16RowsTest, ScatterRoundsEachRowIntoItsOwnDestination) {
  std::vector<float> src = source_rows(4);
  const TensorView src_view{src.data(), DType::kF32, {4, kRow}, Device::kCpu};
  // Two buffers: rows 3 and 0 into the first (its rows 0 and 2), row 1 into the second's row 1.
  std::vector<uint16_t> first(3 * kRow, 0xabcd), second(2 * kRow, 0xabcd);
  std::vector<RowDestination> rows = {{3, first.data()}, {0, first.data() + 2 * kRow}, {1, second.data() + kRow}};
  scatter_rows_to_bf16(src_view, table_view(rows), 0);
  const auto expect_row = [&](const uint16_t* got, int64_t source_row) {
    for (int64_t e = 0; e < kRow; ++e)
      EXPECT_EQ(got[e], f32_to_bf16(src[static_cast<size_t>(source_row * kRow + e)])) << source_row << " " << e;
  };
  expect_row(first.data(), 3);
  expect_row(first.data() + 2 * kRow, 0);
  expect_row(second.data() + kRow, 1);
  for (int64_t e = 0; e < kRow; ++e) {
    EXPECT_EQ(first[static_cast<size_t>(kRow + e)], 0xabcd);  // rows no destination names stay
    EXPECT_EQ(second[static_cast<size_t>(e)], 0xabcd);
  }
  // Ties go to even, the rest to nearest.
  EXPECT_EQ(bf16_to_f32(first[2 * kRow]), 1.0f);
  EXPECT_EQ(bf16_to_f32(first[2 * kRow + 1]), 1.0f + 4 * 0x1p-8f);
  // The same table, offset by one row: each row lands one row further on (the first buffer's row 1 now).
  std::vector<RowDestination> offset_rows = {{2, first.data()}};
  scatter_rows_to_bf16(src_view, table_view(offset_rows), kRow);
  expect_row(first.data() + kRow, 2);
  expect_row(first.data(), 3);
}

TEST(Bf16RowsTest, ConvertWidensExactlyAndRoundsToNearestEven) {
  std::vector<float> src = source_rows(2);
  const auto n = static_cast<int64_t>(src.size());
  std::vector<uint16_t> narrow(src.size());
  convert(TensorView{narrow.data(), DType::kBF16, {n}, Device::kCpu},
          TensorView{src.data(), DType::kF32, {n}, Device::kCpu});
  std::vector<float> wide(src.size());
  convert(TensorView{wide.data(), DType::kF32, {2, kRow}, Device::kCpu},
          TensorView{narrow.data(), DType::kBF16, {2, kRow}, Device::kCpu});
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(narrow[i], f32_to_bf16(src[i])) << i;
    EXPECT_EQ(wide[i], bf16_to_f32(narrow[i])) << i;
  }
}

TEST(Bf16RowsDeathTest, RefusesRowsItDoesNotHaveAndOtherDtypes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> src = source_rows(2);
  std::vector<uint16_t> dest(kRow);
  const TensorView src_view{src.data(), DType::kF32, {2, kRow}, Device::kCpu};
  std::vector<RowDestination> past_the_end = {{2, dest.data()}}, first_row = {{0, dest.data()}};
  EXPECT_DEATH(scatter_rows_to_bf16(src_view, table_view(past_the_end), 0), "source row 2 of 2");
  EXPECT_DEATH(
      scatter_rows_to_bf16(TensorView{dest.data(), DType::kBF16, {1, kRow}, Device::kCpu}, table_view(first_row), 0),
      "src bf16");
  EXPECT_DEATH(scatter_rows_to_bf16(src_view, TensorView{first_row.data(), DType::kI32, {1, 4}, Device::kCpu}, 0),
               "an \\[n, 2\\] I64 table");
  EXPECT_DEATH(scatter_rows_to_bf16(src_view, table_view(first_row), -1), "offset -1");
  std::vector<int32_t> ints(kRow);
  EXPECT_DEATH(convert(TensorView{ints.data(), DType::kI32, {kRow}, Device::kCpu}, src_view), "convert: f32 to i32");
  EXPECT_DEATH(convert(TensorView{dest.data(), DType::kBF16, {kRow}, Device::kCpu}, src_view), "convert: \\[2, 5\\]");
}

}  // namespace
}  // namespace se
