// RecentQueries: the ring hands back the newest rows of each layer oldest first, as the bf16 rounding of what went
// in, across wraps, after appends of one row, of several (wrapping within one append) and of more rows than it holds;
// one placement serves every layer, each layer's rows copied at its own stride; several sequences' rows placed from
// one batch and copied by one scatter_rows_to_bf16 per layer land in their own rings; its storage starts another ring
// empty; a request for more rows than it holds is refused.
#include <gtest/gtest.h>

#include <vector>

#include "backend/device_memory.h"
#include "backend/ops.h"
#include "sparse/methods/recent_queries.h"

namespace se {
namespace {

constexpr int64_t kRow = 6;           // [H = 2, D = 3]
constexpr int32_t kLayerShift = 100;  // layer l's copy of row r is row r + 100 l (bf16 tells them apart below 256)

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

TensorView table_view(std::vector<RowDestination>& destinations) {
  return TensorView{destinations.data(), DType::kI64, {static_cast<int64_t>(destinations.size()), 2}, Device::kCpu};
}

// Copies each layer's batch (batch 0 numbered from `first`, layer l's from first + 100 l) to the places
// `destinations` names, as each layer's on_attention_end does.
void scatter_layers(int num_layers, int64_t layer_stride, int32_t first, int32_t n,
                    std::vector<RowDestination>& destinations) {
  for (int layer = 0; layer < num_layers; ++layer) {
    std::vector<float> rows = numbered_rows(first + kLayerShift * layer, n);
    scatter_rows_to_bf16(batch_view(rows), table_view(destinations), layer * layer_stride);
  }
}

// Appends rows first .. first + n - 1 (layer l's shifted) to every layer of `ring`.
void append(RecentQueries& ring, int32_t first, int32_t n) {
  std::vector<RowDestination> destinations;
  ring.place_rows(0, n, destinations);
  scatter_layers(ring.num_layers(), ring.layer_stride(), first, n, destinations);
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
  EXPECT_EQ(ring.size(), 0);
  EXPECT_EQ(ring.layer_stride(), 4 * kRow);
  append(ring, 0, 1);
  append(ring, 1, 2);
  EXPECT_EQ(ring.size(), 3);
  EXPECT_EQ(newest(ring, 0, 3), bf16_rows(0, 3));
  EXPECT_EQ(newest(ring, 1, 3), bf16_rows(kLayerShift, 3));
  append(ring, 3, 3);  // wraps within the append: the ring holds rows 2 .. 5
  EXPECT_EQ(ring.size(), 4);
  EXPECT_EQ(newest(ring, 0, 4), bf16_rows(2, 4));
  EXPECT_EQ(newest(ring, 0, 2), bf16_rows(4, 2));
  append(ring, 6, 7);  // more than it holds: rows 9 .. 12 stay
  EXPECT_EQ(newest(ring, 0, 4), bf16_rows(9, 4));
  for (int32_t r = 13; r < 19; ++r) append(ring, r, 1);
  EXPECT_EQ(newest(ring, 0, 4), bf16_rows(15, 4));
  EXPECT_EQ(newest(ring, 1, 4), bf16_rows(kLayerShift + 15, 4));
  // The storage serves another sequence from empty.
  RecentQueries next(std::move(ring).release());
  EXPECT_EQ(next.size(), 0);
  append(next, 20, 1);
  EXPECT_EQ(newest(next, 0, 1), bf16_rows(20, 1));
  EXPECT_EQ(newest(next, 1, 1), bf16_rows(kLayerShift + 20, 1));
}

// One batch of rows 0 .. 9 as a step's queries: rows [0, 2) a prefill chunk, then three decode slices, of 1, 2 and 5
// rows. The slices' rings (of one capacity, as a method's are) take their rows in one scatter per layer, each its
// own, the last ring only its newest 4.
TEST(RecentQueriesTest, OneScatterPerLayerFillsEverySequencesRing) {
  RecentQueries a = host_ring(2, 4), b = host_ring(2, 4), c = host_ring(2, 4);
  append(b, 50, 3);  // b already holds rows: the batch's wrap past its end
  std::vector<RowDestination> destinations;
  a.place_rows(2, 1, destinations);
  b.place_rows(3, 2, destinations);
  c.place_rows(5, 5, destinations);
  EXPECT_EQ(destinations.size(), 7u);  // c's oldest row is never copied
  scatter_layers(2, a.layer_stride(), 0, 10, destinations);
  for (int layer = 0; layer < 2; ++layer) {
    const int32_t shift = kLayerShift * layer;
    EXPECT_EQ(newest(a, layer, 1), bf16_rows(shift + 2, 1));
    std::vector<float> b_rows = bf16_rows(shift + 51, 2);
    const std::vector<float> batch_rows = bf16_rows(shift + 3, 2);
    b_rows.insert(b_rows.end(), batch_rows.begin(), batch_rows.end());
    EXPECT_EQ(newest(b, layer, 4), b_rows);
    EXPECT_EQ(newest(c, layer, 4), bf16_rows(shift + 6, 4));
  }
  EXPECT_EQ(c.size(), 4);
}

TEST(RecentQueriesDeathTest, RefusesWhatItDoesNotHold) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  RecentQueries ring = host_ring(1, 4);
  append(ring, 0, 2);
  EXPECT_DEATH(newest(ring, 0, 3), "3 rows asked of layer 0 of 1, which hold 2");
  EXPECT_DEATH(newest(ring, 1, 1), "1 rows asked of layer 1 of 1");
  std::vector<RowDestination> destinations;
  EXPECT_DEATH(ring.place_rows(-1, 2, destinations), "rows \\[-1, 1\\)");
}

}  // namespace
}  // namespace se
