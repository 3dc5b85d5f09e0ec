#include "kv/slot_positions.h"

#include <gtest/gtest.h>

#include <vector>

namespace se {
namespace {

std::vector<int32_t> positions_of(const SlotPositions& p, int32_t stream) {
  const std::span<const int32_t> slots = p.of(stream);
  return {slots.begin(), slots.end()};
}

TEST(SlotPositionsTest, AppendsReachEveryStreamAlike) {
  SlotPositions p(3);
  p.append(0, 4);
  p.append(4, 2);
  for (int32_t s = 0; s < 3; ++s) EXPECT_EQ(positions_of(p, s), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(SlotPositionsTest, KeepCompactsOneStreamAndLaterAppendsFollowIt) {
  SlotPositions p(2);
  p.append(0, 6);
  p.keep(1, std::vector<int32_t>{0, 3, 5});
  EXPECT_EQ(positions_of(p, 0), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(positions_of(p, 1), (std::vector<int32_t>{0, 3, 5}));
  p.append(6, 2);
  EXPECT_EQ(positions_of(p, 1), (std::vector<int32_t>{0, 3, 5, 6, 7}));
  // A second compaction indexes the stream's current slots.
  p.keep(1, std::vector<int32_t>{1, 3});
  EXPECT_EQ(positions_of(p, 1), (std::vector<int32_t>{3, 6}));
  EXPECT_EQ(positions_of(p, 0), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(SlotPositionsTest, DropLastCutsEveryStream) {
  SlotPositions p(2);
  p.append(0, 5);
  p.keep(0, std::vector<int32_t>{1, 4});
  p.append(5, 3);
  p.drop_last(3);
  EXPECT_EQ(positions_of(p, 0), (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(positions_of(p, 1), (std::vector<int32_t>{0, 1, 2, 3, 4}));
}

TEST(SlotPositionsTest, AttachStartsOnAPrefixWithGaps) {
  SlotPositions p(2);
  p.attach(std::vector<int32_t>{0, 1, 6, 7});
  p.append(8, 1);
  EXPECT_EQ(positions_of(p, 1), (std::vector<int32_t>{0, 1, 6, 7, 8}));
}

}  // namespace
}  // namespace se
