// BlockPool: the reference-counted allocator of KV pages. It hands out int32 page ids; the bytes
// live in an optional PageStorage (none = an id-only pool for scheduling simulations and tests).
// Engine thread only.
//
// Ownership rule shared by the whole kv module: every holder owns its references. A call that
// stores a page retains it, a call that drops a page releases it, and no call takes over its
// caller's reference.
//
// Invariants (check_integrity): free + used == total; a page is free iff its ref count is 0; the
// free queue holds each free page exactly once.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "kv/page_storage.h"

namespace se {

class BlockPool final {
 public:
  // An id-only pool of `num_pages` pages (>= 0).
  explicit BlockPool(int32_t num_pages);
  // A pool over `storage`, with one id per storage page.
  explicit BlockPool(std::unique_ptr<PageStorage> storage);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Takes `num_pages` pages from the front of the free queue (the least recently freed) with ref
  // count 1. All or nothing: kResourceExhausted leaves the pool untouched; kInvalidArgument for a
  // negative count.
  Result<std::vector<int32_t>> allocate(int32_t num_pages);
  // Takes the specific free page `page_id` out of the middle of the free queue in O(1), with ref
  // count 1: for a cache that revives a freed page whose contents it knows are still intact.
  Status take(int32_t page_id);
  // Adds a reference to a used page. Precondition: ref_count(page_id) > 0.
  void retain(int32_t page_id);
  // Drops a reference; at zero the page joins the back of the free queue. Returns true when the
  // page was freed. Precondition: ref_count(page_id) > 0.
  bool release(int32_t page_id);
  // Releases each page in order; returns how many were freed.
  int32_t release(std::span<const int32_t> page_ids);

  int32_t num_total_pages() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free_pages() const { return num_free_pages_; }
  int32_t num_used_pages() const { return num_total_pages() - num_free_pages_; }
  // 0 for free pages. Precondition: 0 <= page_id < num_total_pages().
  int32_t ref_count(int32_t page_id) const { return ref_counts_[static_cast<size_t>(page_id)]; }
  bool is_valid_id(int32_t page_id) const { return page_id >= 0 && page_id < num_total_pages(); }

  // The page bytes, or nullptr for an id-only pool.
  PageStorage* storage() const { return storage_.get(); }

  // Ok, or the first violated invariant.
  Status check_integrity() const;

 private:
  void push_back_free(int32_t page_id);
  void unlink_free(int32_t page_id);

  std::unique_ptr<PageStorage> storage_;
  std::vector<int32_t> ref_counts_;  // [num_total_pages]
  // Intrusive doubly linked free queue over page ids; -1 ends it. Front = next to allocate.
  std::vector<int32_t> prev_free_;  // [num_total_pages]
  std::vector<int32_t> next_free_;  // [num_total_pages]
  int32_t free_head_ = -1;
  int32_t free_tail_ = -1;
  int32_t num_free_pages_ = 0;
};

}  // namespace se
