// move_kv_rows on the CPU: each move copies one K and one V row and nothing else; moves whose order would matter
// are refused before anything is copied.
#include <gtest/gtest.h>

#include <vector>

#include "backend/ops.h"
#include "op_test_util.h"

namespace se {
namespace {

constexpr int32_t kPageSize = 4;
constexpr int32_t kHeadDim = 2;
constexpr int32_t kNumPages = 3;

struct NumberedPool : test::NumberedPool<kNumPages, kPageSize, kHeadDim> {
  std::vector<float> row(int32_t page, int kv, int32_t offset) {
    const float* p = view().element<float>(page, kv, offset);
    return {p, p + kHeadDim};
  }
};

TEST(MoveKvRowsTest, CopiesEachMovesKAndVRowOnly) {
  NumberedPool pool;
  // Slot 3 of page 2 into slot 1 of page 0, and the same source into a second destination.
  const std::vector<KvRowMove> moves = {{2, 3, 0, 1}, {2, 3, 1, 0}};
  move_kv_rows(pool.view(), moves);
  NumberedPool expected;
  for (int kv = 0; kv < 2; ++kv) {
    const std::vector<float> source = expected.row(2, kv, 3);
    std::copy(source.begin(), source.end(), expected.view().element<float>(0, kv, 1));
    std::copy(source.begin(), source.end(), expected.view().element<float>(1, kv, 0));
  }
  EXPECT_EQ(pool.data, expected.data);
}

TEST(MoveKvRowsDeathTest, RefusesMovesWhoseOrderWouldMatter) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  NumberedPool pool;
  const std::vector<KvRowMove> chained = {{0, 3, 0, 1}, {0, 1, 0, 2}};  // slot 1 is written by one, read by the other
  EXPECT_DEATH(move_kv_rows(pool.view(), chained), "move_kv_rows: slot 1 of page 0 is written");
  const std::vector<KvRowMove> same_dest = {{0, 3, 0, 1}, {0, 2, 0, 1}};
  EXPECT_DEATH(move_kv_rows(pool.view(), same_dest), "move_kv_rows: slot 1 of page 0 is written");
  const std::vector<KvRowMove> onto_itself = {{1, 2, 1, 2}};
  EXPECT_DEATH(move_kv_rows(pool.view(), onto_itself), "move_kv_rows: slot 2 of page 1 is written");
  const std::vector<KvRowMove> outside = {{0, 4, 0, 1}};
  EXPECT_DEATH(move_kv_rows(pool.view(), outside), "move_kv_rows: no slot 4 of page 0");
}

}  // namespace
}  // namespace se
