// BucketedLru: least-recently-used order over int32 ids (resident KV pages) kept to a coarse clock, so that no
// operation sorts. Time advances in ticks (advance(), e.g. once per step); an id sits in the bucket of the tick it
// was last touched in, one intrusive list per bucket in touch order. kNumBuckets buckets form a ring: when the
// clock wraps, the oldest bucket merges into the next oldest (its ids in front, being older), so every id older than
// kNumBuckets - 1 ticks shares the oldest bucket. The victim is the front of the oldest non-empty bucket: exact LRU
// inside a bucket, tick granularity across buckets. Every operation is O(1) except advance(), which relabels the ids
// of the bucket it merges (each id at most once per kNumBuckets ticks), and oldest(), which scans at most
// kNumBuckets bucket heads. Engine thread only.
//
// Invariants (check_integrity): each id is in at most one bucket, once; a bucket's list and its ids' bucket labels
// agree; size() counts the ids present.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "base/status.h"

namespace se {

class BucketedLru final {
 public:
  static constexpr int32_t kNumBuckets = 64;

  // Ids in [0, capacity).
  explicit BucketedLru(int32_t capacity);

  // Adds an absent id as the most recent one.
  void insert(int32_t id);
  // Makes a present id the most recent one.
  void touch(int32_t id);
  // Removes a present id.
  void erase(int32_t id);
  bool contains(int32_t id) const { return bucket_[static_cast<size_t>(id)] >= 0; }
  int32_t size() const { return size_; }
  int32_t capacity() const { return static_cast<int32_t>(bucket_.size()); }

  // One tick passes: later touches go to a new bucket.
  void advance();
  // The least recently used id (front of the oldest non-empty bucket), or nullopt when empty.
  std::optional<int32_t> oldest() const;
  // Ticks since a present id was last touched, capped at kNumBuckets - 1.
  int32_t age(int32_t id) const;
  // Calls fn(id) for the present ids from the least recently used on, until fn returns false: how an owner finds
  // the oldest of its own ids among others' (O(ids visited + kNumBuckets)).
  template <typename Fn>
  void for_each_oldest_first(Fn&& fn) const {
    for (int32_t age = kNumBuckets - 1; age >= 0; --age)
      for (int32_t id = buckets_[static_cast<size_t>((newest_ - age + kNumBuckets) % kNumBuckets)].head; id >= 0;
           id = next_[static_cast<size_t>(id)])
        if (!fn(id)) return;
  }

  // Ok, or the first violated invariant.
  Status check_integrity() const;

 private:
  struct Bucket {
    int32_t head = -1;
    int32_t tail = -1;
  };
  void push_back(int32_t bucket, int32_t id);
  void unlink(int32_t id);

  std::array<Bucket, kNumBuckets> buckets_;
  int32_t newest_ = 0;           // ring index of the current tick's bucket
  std::vector<int32_t> bucket_;  // [capacity] ring index of each id's bucket, -1 when absent
  std::vector<int32_t> prev_;    // [capacity] intrusive list links, -1 ends
  std::vector<int32_t> next_;    // [capacity]
  int32_t size_ = 0;
};

}  // namespace se
