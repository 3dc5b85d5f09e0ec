// RecentQueries: the ring hands back the newest rows of each layer oldest first, across wraps, after appends of one
// row, of several and of more rows than it holds; layers are independent; its storage starts another ring empty; a
// request for more rows than it holds and rows of another width are refused.
#include <gtest/gtest.h>

#include <vector>

#include "backend/device_memory.h"
#include "sparse/methods/recent_queries.h"

namespace se {
namespace {

constexpr int64_t kRow = 6;  // [H = 2, D = 3]

// Rows first .. first + n - 1, each filled with its number.
std::vector<float> numbered_rows(int32_t first, int32_t n) {
  std::vector<float> rows;
  for (int32_t r = first; r < first + n; ++r) rows.insert(rows.end(), kRow, static_cast<float>(r));
  return rows;
}

void append(RecentQueries& ring, int layer, int32_t first, int32_t n) {
  std::vector<float> rows = numbered_rows(first, n);
  ring.append(layer, TensorView{rows.data(), DType::kF32, {n, 2, 3}, Device::kCpu});
}

// A ring of `num_layers` x `capacity` rows on the host.
RecentQueries host_ring(int num_layers, int32_t capacity) {
  return RecentQueries(empty_on(Device::kCpu, DType::kF32, {num_layers, capacity, kRow}));
}

std::vector<float> newest(const RecentQueries& ring, int layer, int32_t n) {
  std::vector<float> out(static_cast<size_t>(n * kRow), -1.0f);
  ring.newest(layer, n, TensorView{out.data(), DType::kF32, {n, 2, 3}, Device::kCpu});
  return out;
}

TEST(RecentQueriesTest, NewestRowsOldestFirstAcrossWraps) {
  RecentQueries ring = host_ring(2, 4);
  EXPECT_EQ(ring.size(0), 0);
  append(ring, 0, 0, 1);
  append(ring, 0, 1, 2);
  EXPECT_EQ(ring.size(0), 3);
  EXPECT_EQ(ring.size(1), 0);
  EXPECT_EQ(newest(ring, 0, 3), numbered_rows(0, 3));
  append(ring, 0, 3, 3);  // wraps: the ring holds rows 2 .. 5
  EXPECT_EQ(ring.size(0), 4);
  EXPECT_EQ(newest(ring, 0, 4), numbered_rows(2, 4));
  EXPECT_EQ(newest(ring, 0, 2), numbered_rows(4, 2));
  append(ring, 0, 6, 7);  // more than it holds: rows 9 .. 12 stay
  EXPECT_EQ(newest(ring, 0, 4), numbered_rows(9, 4));
  for (int32_t r = 13; r < 19; ++r) append(ring, 0, r, 1);
  EXPECT_EQ(newest(ring, 0, 4), numbered_rows(15, 4));
  append(ring, 1, 100, 2);
  EXPECT_EQ(newest(ring, 1, 2), numbered_rows(100, 2));
  EXPECT_EQ(newest(ring, 0, 1), numbered_rows(18, 1));
  // The storage serves another sequence from empty.
  RecentQueries next(std::move(ring).release());
  EXPECT_EQ(next.size(0), 0);
  append(next, 0, 200, 1);
  EXPECT_EQ(newest(next, 0, 1), numbered_rows(200, 1));
}

TEST(RecentQueriesDeathTest, RefusesWhatItDoesNotHold) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  RecentQueries ring = host_ring(1, 4);
  append(ring, 0, 0, 2);
  EXPECT_DEATH(newest(ring, 0, 3), "3 rows asked of layer 0, which holds 2");
  std::vector<float> wide(8);
  EXPECT_DEATH(ring.append(0, TensorView{wide.data(), DType::kF32, {1, 2, 4}, Device::kCpu}),
               "for a ring of 6-element F32 rows");
}

}  // namespace
}  // namespace se
