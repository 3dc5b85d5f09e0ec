// BucketedLru against a reference that remembers each id's last touch: random inserts, touches, erases and ticks
// (past several wraps of the 64-bucket ring), with check_integrity after each; the victim is always the id of the
// largest capped age, earliest touched among those, the walk oldest first visits every id in that order, and each
// id's age is its ticks since its touch, capped at 63.
#include <gtest/gtest.h>

#include <random>

#include "kv/bucketed_lru.h"

namespace se {
namespace {

TEST(BucketedLruTest, OrderInsideAndAcrossBuckets) {
  BucketedLru lru(8);
  EXPECT_FALSE(lru.oldest().has_value());
  lru.insert(3);
  lru.insert(5);
  lru.advance();
  lru.insert(1);
  EXPECT_EQ(lru.oldest(), 3);
  lru.touch(3);  // now the newest: 5 is the least recently used
  EXPECT_EQ(lru.oldest(), 5);
  EXPECT_EQ(lru.age(5), 1);
  EXPECT_EQ(lru.age(3), 0);
  lru.erase(5);
  EXPECT_EQ(lru.oldest(), 1);
  EXPECT_EQ(lru.size(), 2);
  EXPECT_TRUE(lru.check_integrity().is_ok());
}

TEST(BucketedLruTest, OldIdsShareTheOldestBucketInTouchOrder) {
  BucketedLru lru(4);
  lru.insert(2);
  lru.advance();
  lru.insert(0);
  for (int t = 0; t < 200; ++t) lru.advance();  // both far past the ring
  lru.insert(1);
  EXPECT_EQ(lru.age(2), BucketedLru::kNumBuckets - 1);
  EXPECT_EQ(lru.age(0), BucketedLru::kNumBuckets - 1);
  EXPECT_EQ(lru.oldest(), 2);
  lru.erase(2);
  EXPECT_EQ(lru.oldest(), 0);
  EXPECT_TRUE(lru.check_integrity().is_ok());
}

TEST(BucketedLruTest, RandomOperationsMatchTheReference) {
  constexpr int32_t kCapacity = 40;
  std::mt19937 rng(35);
  BucketedLru lru(kCapacity);
  std::vector<int64_t> touched_tick(kCapacity, -1), touched_seq(kCapacity, -1);  // -1: absent
  int64_t tick = 0, seq = 0;
  for (int step = 0; step < 20000; ++step) {
    const int32_t id = static_cast<int32_t>(rng() % kCapacity);
    const bool present = touched_tick[static_cast<size_t>(id)] >= 0;
    switch (rng() % 4) {
      case 0:
        if (present) {
          lru.touch(id);
        } else {
          lru.insert(id);
        }
        touched_tick[static_cast<size_t>(id)] = tick;
        touched_seq[static_cast<size_t>(id)] = seq++;
        break;
      case 1:
        if (present) {
          lru.erase(id);
          touched_tick[static_cast<size_t>(id)] = -1;
        }
        break;
      default:
        // Ticks come in bursts, so ids both spread over the ring and pile up in its oldest bucket.
        for (int n = static_cast<int>(rng() % 5); n > 0; --n, ++tick) lru.advance();
    }
    ASSERT_TRUE(lru.check_integrity().is_ok()) << step;
    int32_t want = -1, size = 0;
    auto capped = [&](int32_t i) {
      return std::min<int64_t>(tick - touched_tick[static_cast<size_t>(i)], BucketedLru::kNumBuckets - 1);
    };
    for (int32_t i = 0; i < kCapacity; ++i) {
      if (touched_tick[static_cast<size_t>(i)] < 0) continue;
      ++size;
      ASSERT_EQ(lru.age(i), capped(i)) << "step " << step << " id " << i;
      if (want < 0 || capped(i) > capped(want) ||
          (capped(i) == capped(want) && touched_seq[static_cast<size_t>(i)] < touched_seq[static_cast<size_t>(want)]))
        want = i;
    }
    ASSERT_EQ(lru.size(), size);
    // The walk visits every id once, in the reference's order: capped age down, touch order inside an age.
    std::vector<int32_t> walked;
    lru.for_each_oldest_first([&](int32_t i) {
      walked.push_back(i);
      return true;
    });
    ASSERT_EQ(static_cast<int32_t>(walked.size()), size) << step;
    for (size_t w = 1; w < walked.size(); ++w) {
      const int32_t a = walked[w - 1], b = walked[w];
      ASSERT_TRUE(capped(a) > capped(b) ||
                  (capped(a) == capped(b) && touched_seq[static_cast<size_t>(a)] < touched_seq[static_cast<size_t>(b)]))
          << "step " << step << ": " << a << " walked before " << b;
    }
    if (want < 0) {
      ASSERT_FALSE(lru.oldest().has_value());
    } else {
      ASSERT_EQ(lru.oldest(), want) << step;
    }
  }
}

}  // namespace
}  // namespace se
