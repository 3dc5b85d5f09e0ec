// RecentQueries: the ring hands back the newest rows of each layer oldest first, as the bf16 rounding of what went
// in, across wraps, after appends of one row, of several (wrapping within one append) and of more rows than it holds;
// layers are independent; several sequences' rows placed from one batch and copied by one scatter_rows_to_bf16 land
// in their own rings; its storage starts another ring empty; a request for more rows than it holds and rows of
// another width are refused.
#include <gtest/gtest.h>

#include <vector>

#include "backend/device_memory.h"
#include "backend/ops.h"
#include "sparse/methods/recent_queries.h"

namespace se {
namespace {

constexpr int64_t kRow = 6;  // [H = 2, D = 3]

// Rows first .. first + n - 1: row r holds r + 0.3 + 0.01 e at element e, which bf16 does not hold exactly (below
// 256 it still tells the rows apart).
std::vector<float> numbered_rows(int32_t first, int32_t n) {
  std::vector<float> rows;
  for (int32_t r = first; r < first + n; ++r)
    for (int64_t e = 0; e < kRow; ++e) rows.push_back(static_cast<float>(r) + 0.3f + 0.01f * static_cast<float>(e));
  return rows;
}

// What the ring hands back for them.
std::vector<float> bf16_rows(int32_t first, int32_t n) {
  std::vector<float> rows = numbered_rows(first, n);
  for (float& x : rows) x = bf16_to_f32(f32_to_bf16(x));
  return rows;
}

TensorView batch_view(std::vector<float>& rows) {
  return TensorView{rows.data(), DType::kF32, {static_cast<int64_t>(rows.size()) / kRow, 2, 3}, Device::kCpu};
}

void append(RecentQueries& ring, int layer, int32_t first, int32_t n) {
  std::vector<float> rows = numbered_rows(first, n);
  std::vector<RowDestination> destinations;
  ring.place_rows(layer, batch_view(rows), 0, n, destinations);
  scatter_rows_to_bf16(batch_view(rows), destinations);
}

// A ring of `num_layers` x `capacity` rows on the host.
RecentQueries host_ring(int num_layers, int32_t capacity) {
  return RecentQueries(empty_on(Device::kCpu, DType::kBF16, {num_layers, capacity, kRow}));
}

std::vector<float> newest(const RecentQueries& ring, int layer, int32_t n) {
  std::vector<float> out(static_cast<size_t>(n * kRow), -1.0f);
  ring.newest(layer, n, TensorView{out.data(), DType::kF32, {n, 2, 3}, Device::kCpu});
  return out;
}

TEST(RecentQueriesTest, NewestRowsOldestFirstAcrossWraps) {
  ASSERT_NE(bf16_rows(0, 1), numbered_rows(0, 1));  // the test sees whether the rows were rounded
  RecentQueries ring = host_ring(2, 4);
  EXPECT_EQ(ring.size(0), 0);
  append(ring, 0, 0, 1);
  append(ring, 0, 1, 2);
  EXPECT_EQ(ring.size(0), 3);
  EXPECT_EQ(ring.size(1), 0);
  EXPECT_EQ(newest(ring, 0, 3), bf16_rows(0, 3));
  append(ring, 0, 3, 3);  // wraps within the append: the ring holds rows 2 .. 5
  EXPECT_EQ(ring.size(0), 4);
  EXPECT_EQ(newest(ring, 0, 4), bf16_rows(2, 4));
  EXPECT_EQ(newest(ring, 0, 2), bf16_rows(4, 2));
  append(ring, 0, 6, 7);  // more than it holds: rows 9 .. 12 stay
  EXPECT_EQ(newest(ring, 0, 4), bf16_rows(9, 4));
  for (int32_t r = 13; r < 19; ++r) append(ring, 0, r, 1);
  EXPECT_EQ(newest(ring, 0, 4), bf16_rows(15, 4));
  append(ring, 1, 100, 2);
  EXPECT_EQ(newest(ring, 1, 2), bf16_rows(100, 2));
  EXPECT_EQ(newest(ring, 0, 1), bf16_rows(18, 1));
  // The storage serves another sequence from empty.
  RecentQueries next(std::move(ring).release());
  EXPECT_EQ(next.size(0), 0);
  append(next, 0, 200, 1);
  EXPECT_EQ(newest(next, 0, 1), bf16_rows(200, 1));
}

// One batch of rows 0 .. 9 as a step's queries: rows [0, 3) a prefill chunk, then three decode slices, of 1, 2 and 4
// rows. The slices' rings take their rows in one scatter, each its own, the last ring (capacity 3) only its newest.
TEST(RecentQueriesTest, OneScatterFillsEverySequencesRing) {
  RecentQueries a = host_ring(2, 4), b = host_ring(2, 4), c = host_ring(2, 3);
  append(b, 1, 50, 3);  // b already holds rows: the batch's wrap past its end
  std::vector<float> batch = numbered_rows(0, 10);
  std::vector<RowDestination> destinations;
  a.place_rows(1, batch_view(batch), 3, 1, destinations);
  b.place_rows(1, batch_view(batch), 4, 2, destinations);
  c.place_rows(1, batch_view(batch), 6, 4, destinations);
  EXPECT_EQ(destinations.size(), 6u);  // c's oldest row is never copied
  scatter_rows_to_bf16(batch_view(batch), destinations);
  EXPECT_EQ(newest(a, 1, 1), bf16_rows(3, 1));
  std::vector<float> b_rows = bf16_rows(51, 2);
  const std::vector<float> batch_rows = bf16_rows(4, 2);
  b_rows.insert(b_rows.end(), batch_rows.begin(), batch_rows.end());
  EXPECT_EQ(newest(b, 1, 4), b_rows);
  EXPECT_EQ(c.size(1), 3);
  EXPECT_EQ(newest(c, 1, 3), bf16_rows(7, 3));
  EXPECT_EQ(a.size(0), 0);
  EXPECT_EQ(c.size(0), 0);
}

TEST(RecentQueriesDeathTest, RefusesWhatItDoesNotHold) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  RecentQueries ring = host_ring(1, 4);
  append(ring, 0, 0, 2);
  EXPECT_DEATH(newest(ring, 0, 3), "3 rows asked of layer 0, which holds 2");
  std::vector<float> wide(8);
  std::vector<RowDestination> destinations;
  EXPECT_DEATH(ring.place_rows(0, TensorView{wide.data(), DType::kF32, {1, 2, 4}, Device::kCpu}, 0, 1, destinations),
               "for a ring of 6-element rows");
  std::vector<float> rows = numbered_rows(0, 2);
  EXPECT_DEATH(ring.place_rows(0, batch_view(rows), 1, 2, destinations), "rows \\[1, 3\\) of 2 into layer 0");
}

}  // namespace
}  // namespace se
