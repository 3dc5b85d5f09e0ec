#include "kv/bucketed_lru.h"

#include "base/check.h"

namespace se {

BucketedLru::BucketedLru(int32_t capacity) {
  SE_CHECK(capacity >= 0, "bucketed LRU: negative capacity {}", capacity);
  bucket_.assign(static_cast<size_t>(capacity), -1);
  prev_.assign(static_cast<size_t>(capacity), -1);
  next_.assign(static_cast<size_t>(capacity), -1);
}

void BucketedLru::push_back(int32_t bucket, int32_t id) {
  Bucket& b = buckets_[static_cast<size_t>(bucket)];
  const auto i = static_cast<size_t>(id);
  bucket_[i] = bucket;
  prev_[i] = b.tail;
  next_[i] = -1;
  if (b.tail >= 0) {
    next_[static_cast<size_t>(b.tail)] = id;
  } else {
    b.head = id;
  }
  b.tail = id;
}

void BucketedLru::unlink(int32_t id) {
  const auto i = static_cast<size_t>(id);
  Bucket& b = buckets_[static_cast<size_t>(bucket_[i])];
  if (prev_[i] >= 0) {
    next_[static_cast<size_t>(prev_[i])] = next_[i];
  } else {
    b.head = next_[i];
  }
  if (next_[i] >= 0) {
    prev_[static_cast<size_t>(next_[i])] = prev_[i];
  } else {
    b.tail = prev_[i];
  }
  bucket_[i] = prev_[i] = next_[i] = -1;
}

void BucketedLru::insert(int32_t id) {
  SE_CHECK(id >= 0 && id < capacity() && !contains(id), "bucketed LRU: cannot insert id {}", id);
  push_back(newest_, id);
  ++size_;
}

void BucketedLru::touch(int32_t id) {
  SE_CHECK(id >= 0 && id < capacity() && contains(id), "bucketed LRU: cannot touch absent id {}", id);
  unlink(id);
  push_back(newest_, id);
}

void BucketedLru::erase(int32_t id) {
  SE_CHECK(id >= 0 && id < capacity() && contains(id), "bucketed LRU: cannot erase absent id {}", id);
  unlink(id);
  --size_;
}

void BucketedLru::advance() {
  const int32_t next = (newest_ + 1) % kNumBuckets;  // the oldest bucket, about to be the newest
  const int32_t into = (newest_ + 2) % kNumBuckets;  // the next oldest, about to be the oldest
  Bucket& from = buckets_[static_cast<size_t>(next)];
  if (from.head >= 0) {
    for (int32_t id = from.head; id >= 0; id = next_[static_cast<size_t>(id)]) bucket_[static_cast<size_t>(id)] = into;
    // The merged ids are older than every id of `into`: they go in front.
    Bucket& to = buckets_[static_cast<size_t>(into)];
    if (to.head >= 0) {
      next_[static_cast<size_t>(from.tail)] = to.head;
      prev_[static_cast<size_t>(to.head)] = from.tail;
    } else {
      to.tail = from.tail;
    }
    to.head = from.head;
    from = Bucket{};
  }
  newest_ = next;
}

std::optional<int32_t> BucketedLru::oldest() const {
  for (int32_t age = kNumBuckets - 1; age >= 0; --age) {
    const Bucket& b = buckets_[static_cast<size_t>((newest_ - age + kNumBuckets) % kNumBuckets)];
    if (b.head >= 0) return b.head;
  }
  return std::nullopt;
}

int32_t BucketedLru::age(int32_t id) const {
  SE_CHECK(id >= 0 && id < capacity() && contains(id), "bucketed LRU: no age for absent id {}", id);
  return (newest_ - bucket_[static_cast<size_t>(id)] + kNumBuckets) % kNumBuckets;
}

Status BucketedLru::check_integrity() const {
  std::vector<uint8_t> seen(bucket_.size(), 0);
  int32_t listed = 0;
  for (int32_t b = 0; b < kNumBuckets; ++b) {
    int32_t prev = -1;
    for (int32_t id = buckets_[static_cast<size_t>(b)].head; id >= 0; id = next_[static_cast<size_t>(id)]) {
      const auto i = static_cast<size_t>(id);
      if (id >= capacity() || seen[i]) return internal_error("bucketed LRU: id {} listed twice or out of range", id);
      seen[i] = 1;
      if (bucket_[i] != b) return internal_error("bucketed LRU: id {} in bucket {} labelled {}", id, b, bucket_[i]);
      if (prev_[i] != prev) return internal_error("bucketed LRU: id {} has a broken back link", id);
      prev = id;
      ++listed;
    }
    if (buckets_[static_cast<size_t>(b)].tail != prev) return internal_error("bucketed LRU: bucket {} tail", b);
  }
  for (size_t i = 0; i < bucket_.size(); ++i)
    if (!seen[i] && bucket_[i] >= 0) return internal_error("bucketed LRU: id {} labelled but unlisted", i);
  if (listed != size_) return internal_error("bucketed LRU: {} ids listed, size {}", listed, size_);
  return Status::ok();
}

}  // namespace se
