#include "kv/block_pool.h"

#include "base/check.h"

namespace se {

BlockPool::BlockPool(int32_t num_pages) {
  SE_CHECK(num_pages >= 0, "block pool: no storage or a negative page count {}", num_pages);
  const auto n = static_cast<size_t>(num_pages);
  ref_counts_.assign(n, 0);
  prev_free_.assign(n, -1);
  next_free_.assign(n, -1);
  // Start in id order so a fresh pool hands out 0, 1, 2, ...
  for (int32_t id = 0; id < num_pages; ++id) push_back_free(id);
}

BlockPool::BlockPool(std::unique_ptr<PageStorage> storage)
    : BlockPool(storage == nullptr ? -1 : storage->num_pages()) {
  storage_ = std::move(storage);
}

void BlockPool::push_back_free(int32_t page_id) {
  const auto i = static_cast<size_t>(page_id);
  prev_free_[i] = free_tail_;
  next_free_[i] = -1;
  if (free_tail_ >= 0) {
    next_free_[static_cast<size_t>(free_tail_)] = page_id;
  } else {
    free_head_ = page_id;
  }
  free_tail_ = page_id;
  ++num_free_pages_;
}

void BlockPool::unlink_free(int32_t page_id) {
  const auto i = static_cast<size_t>(page_id);
  const int32_t prev = prev_free_[i];
  const int32_t next = next_free_[i];
  if (prev >= 0) {
    next_free_[static_cast<size_t>(prev)] = next;
  } else {
    free_head_ = next;
  }
  if (next >= 0) {
    prev_free_[static_cast<size_t>(next)] = prev;
  } else {
    free_tail_ = prev;
  }
  prev_free_[i] = -1;
  next_free_[i] = -1;
  --num_free_pages_;
}

Result<std::vector<int32_t>> BlockPool::allocate(int32_t num_pages) {
  if (num_pages < 0) return invalid_argument("block pool: cannot allocate {} pages", num_pages);
  if (num_pages > num_free_pages_) {
    return resource_exhausted("block pool: {} pages requested, {} free of {}", num_pages,
                              num_free_pages_, num_total_pages());
  }
  std::vector<int32_t> pages;
  pages.reserve(static_cast<size_t>(num_pages));
  for (int32_t k = 0; k < num_pages; ++k) {
    const int32_t id = free_head_;
    unlink_free(id);
    ref_counts_[static_cast<size_t>(id)] = 1;
    pages.push_back(id);
  }
  return pages;
}

Status BlockPool::take(int32_t page_id) {
  if (!is_valid_id(page_id)) {
    return invalid_argument("block pool: page id {} out of range [0, {})", page_id,
                            num_total_pages());
  }
  if (ref_counts_[static_cast<size_t>(page_id)] != 0) {
    return failed_precondition("block pool: page {} is in use (ref count {})", page_id,
                               ref_count(page_id));
  }
  unlink_free(page_id);
  ref_counts_[static_cast<size_t>(page_id)] = 1;
  return Status::ok();
}

void BlockPool::retain(int32_t page_id) {
  SE_CHECK(is_valid_id(page_id) && ref_counts_[static_cast<size_t>(page_id)] > 0,
           "block pool: retain of page {} which is not in use", page_id);
  ++ref_counts_[static_cast<size_t>(page_id)];
}

bool BlockPool::release(int32_t page_id) {
  SE_CHECK(is_valid_id(page_id) && ref_counts_[static_cast<size_t>(page_id)] > 0,
           "block pool: release of page {} which is not in use", page_id);
  if (--ref_counts_[static_cast<size_t>(page_id)] > 0) return false;
  push_back_free(page_id);
  return true;
}

int32_t BlockPool::release(std::span<const int32_t> page_ids) {
  int32_t num_freed = 0;
  for (int32_t id : page_ids) num_freed += release(id) ? 1 : 0;
  return num_freed;
}

Status BlockPool::check_integrity() const {
  const int32_t total = num_total_pages();
  std::vector<bool> in_queue(static_cast<size_t>(total), false);
  int32_t num_in_queue = 0;
  int32_t prev = -1;
  for (int32_t id = free_head_; id >= 0; id = next_free_[static_cast<size_t>(id)]) {
    if (!is_valid_id(id)) return internal_error("block pool: free queue holds invalid id {}", id);
    if (in_queue[static_cast<size_t>(id)]) {
      return internal_error("block pool: page {} twice in free queue", id);
    }
    if (num_in_queue >= total) return internal_error("block pool: free queue longer than the pool");
    in_queue[static_cast<size_t>(id)] = true;
    ++num_in_queue;
    if (prev_free_[static_cast<size_t>(id)] != prev) {
      return internal_error("block pool: page {} has back link {}, expected {}", id,
                            prev_free_[static_cast<size_t>(id)], prev);
    }
    if (ref_counts_[static_cast<size_t>(id)] != 0) {
      return internal_error("block pool: page {} is free and used (ref count {})", id,
                            ref_count(id));
    }
    prev = id;
  }
  if (prev != free_tail_) {
    return internal_error("block pool: free queue ends at {}, tail is {}", prev, free_tail_);
  }
  if (num_in_queue != num_free_pages_) {
    return internal_error("block pool: {} pages in free queue, counter says {}", num_in_queue,
                          num_free_pages_);
  }
  int32_t num_used = 0;
  for (int32_t id = 0; id < total; ++id) {
    const int32_t refs = ref_counts_[static_cast<size_t>(id)];
    if (refs < 0) return internal_error("block pool: page {} has negative ref count {}", id, refs);
    if (refs == 0 && !in_queue[static_cast<size_t>(id)]) {
      return internal_error("block pool: page {} has no references but is not in the free queue",
                            id);
    }
    if (refs > 0) ++num_used;
  }
  if (num_used + num_free_pages_ != total) {
    return internal_error("block pool: {} used + {} free != {} total", num_used, num_free_pages_,
                          total);
  }
  return Status::ok();
}

}  // namespace se
