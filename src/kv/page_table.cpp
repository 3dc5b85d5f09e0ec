#include "kv/page_table.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "base/check.h"

namespace se {

namespace {
// A fresh PageTable epoch: one counter for every table of the process.
uint64_t next_epoch() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}
}  // namespace

PageTable::PageTable(BlockPool* pool, const KvLayout& layout)
    : pool_(pool), layout_(layout), epoch_(next_epoch()) {
  SE_CHECK(pool != nullptr, "page table: no pool");
  const Status valid = layout.validate();
  SE_CHECK(valid.is_ok(), "page table: {}", valid.message());
  num_tokens_.assign(static_cast<size_t>(layout.num_streams()), 0);
  spare_.assign(static_cast<size_t>(layout.num_streams()), -1);
}

PageTable::~PageTable() {
  if (pool_ != nullptr) free_all();
}

PageTable::PageTable(PageTable&& other) noexcept
    : pool_(other.pool_),
      layout_(other.layout_),
      num_logical_tokens_(other.num_logical_tokens_),
      stride_(other.stride_),
      page_ids_(std::move(other.page_ids_)),
      num_tokens_(std::move(other.num_tokens_)),
      spare_(std::move(other.spare_)),
      epoch_(other.epoch_) {
  // The moved-from table holds nothing, so its destructor releases nothing.
  other.epoch_ = next_epoch();
  other.pool_ = nullptr;
  other.num_logical_tokens_ = 0;
  other.stride_ = 0;
  other.page_ids_.clear();
  other.num_tokens_.clear();
  other.spare_.clear();
}

PageTable& PageTable::operator=(PageTable&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr) free_all();
    pool_ = other.pool_;
    layout_ = other.layout_;
    num_logical_tokens_ = other.num_logical_tokens_;
    stride_ = other.stride_;
    page_ids_ = std::move(other.page_ids_);
    num_tokens_ = std::move(other.num_tokens_);
    spare_ = std::move(other.spare_);
    epoch_ = other.epoch_;
    other.epoch_ = next_epoch();
    other.pool_ = nullptr;
    other.num_logical_tokens_ = 0;
    other.stride_ = 0;
    other.page_ids_.clear();
    other.num_tokens_.clear();
    other.spare_.clear();
  }
  return *this;
}

Status PageTable::check_stream(int32_t layer, int32_t head) const {
  if (layer < 0 || layer >= layout_.num_layers || head < 0 || head >= layout_.num_kv_heads) {
    return invalid_argument("page table: (layer {}, head {}) outside {} layers x {} KV heads",
                            layer, head, layout_.num_layers, layout_.num_kv_heads);
  }
  return Status::ok();
}

size_t PageTable::stream_idx(int32_t layer, int32_t head) const {
  SE_CHECK(layer >= 0 && layer < layout_.num_layers && head >= 0 && head < layout_.num_kv_heads,
           "page table: (layer {}, head {}) outside {} layers x {} KV heads", layer, head,
           layout_.num_layers, layout_.num_kv_heads);
  return static_cast<size_t>(layout_.stream(layer, head));
}

int32_t PageTable::num_pages(int32_t layer, int32_t head) const {
  return pages_for(num_tokens_[stream_idx(layer, head)]);
}

std::span<const int32_t> PageTable::pages(int32_t layer, int32_t head) const {
  const size_t s = stream_idx(layer, head);
  return {row(s), static_cast<size_t>(pages_for(num_tokens_[s]))};
}

int64_t PageTable::num_held_pages() const {
  int64_t total = 0;
  for (int32_t n : num_tokens_) total += pages_for(n);
  for (int32_t spare : spare_) total += spare >= 0 ? 1 : 0;
  return total;
}

size_t PageTable::metadata_bytes() const {
  return (page_ids_.capacity() + num_tokens_.capacity() + spare_.capacity()) * sizeof(int32_t);
}

PageSlot PageTable::slot(int32_t layer, int32_t head, int32_t token_idx) const {
  const size_t s = stream_idx(layer, head);
  SE_CHECK(token_idx >= 0 && token_idx < num_tokens_[s],
           "page table: token {} outside stream of {} tokens", token_idx, num_tokens_[s]);
  return PageSlot{row(s)[token_idx / layout_.page_size], token_idx % layout_.page_size};
}

void PageTable::ensure_stride(int32_t num_pages) {
  if (num_pages <= stride_) return;
  // Grow by 1.5x so repeated appends cost amortized O(1) per page without doubling the worst-case
  // footprint.
  const int64_t grown = static_cast<int64_t>(stride_) + stride_ / 2;
  const auto new_stride = static_cast<int32_t>(std::max<int64_t>({num_pages, grown, 4}));
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  std::vector<int32_t> ids(num_streams * static_cast<size_t>(new_stride), -1);
  for (size_t s = 0; s < num_streams; ++s) {
    std::copy_n(row(s), pages_for(num_tokens_[s]),
                ids.data() + s * static_cast<size_t>(new_stride));
  }
  page_ids_ = std::move(ids);
  stride_ = new_stride;
}

void PageTable::reserve(int32_t num_tokens) { ensure_stride(pages_for(num_tokens)); }

bool PageTable::partial_page_shared(size_t stream, int32_t num_tokens) const {
  if (num_tokens % layout_.page_size == 0) return false;
  return pool_->ref_count(row(stream)[num_tokens / layout_.page_size]) > 1;
}

int64_t PageTable::num_pages_for_append(int32_t num_new_tokens) const {
  int64_t total = 0;
  for (size_t s = 0; s < num_tokens_.size(); ++s) {
    const int64_t n = num_tokens_[s];
    const int64_t grown = layout_.pages_per_stream(n + num_new_tokens) - pages_for(num_tokens_[s]);
    total += grown > 0 && spare_[s] >= 0 ? grown - 1 : grown;
  }
  return total;
}

Status PageTable::append(int32_t num_new_tokens) {
  if (num_new_tokens < 0) {
    return invalid_argument("page table: cannot append {} tokens", num_new_tokens);
  }
  if (num_new_tokens == 0) return Status::ok();
  if (num_logical_tokens_ > std::numeric_limits<int32_t>::max() - num_new_tokens) {
    return out_of_range("page table: {} + {} tokens overflow int32", num_logical_tokens_,
                        num_new_tokens);
  }
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  int32_t max_pages = 0;
  for (size_t s = 0; s < num_streams; ++s) {
    if (partial_page_shared(s, num_tokens_[s])) {
      return failed_precondition("page table: stream {} would write into page {} held by {} owners",
                                 s, row(s)[num_tokens_[s] / layout_.page_size],
                                 pool_->ref_count(row(s)[num_tokens_[s] / layout_.page_size]));
    }
    max_pages = std::max(max_pages, pages_for(num_tokens_[s] + num_new_tokens));
  }
  const int64_t num_needed = num_pages_for_append(num_new_tokens);
  if (num_needed > std::numeric_limits<int32_t>::max()) {
    return resource_exhausted("page table: appending {} tokens needs {} pages", num_new_tokens,
                              num_needed);
  }
  auto allocated = pool_->allocate(static_cast<int32_t>(num_needed));
  if (!allocated.is_ok()) {
    return allocated.status().with_context(
        fmt::format("page table: appending {} tokens", num_new_tokens));
  }
  ensure_stride(max_pages);
  size_t next = 0;
  for (size_t s = 0; s < num_streams; ++s) {
    const int32_t old_pages = pages_for(num_tokens_[s]);
    num_tokens_[s] += num_new_tokens;
    for (int32_t p = old_pages; p < pages_for(num_tokens_[s]); ++p) {
      if (p == old_pages && spare_[s] >= 0) {
        row(s)[p] = spare_[s];  // where it was listed before (a stride growth may not have kept the entry)
        spare_[s] = -1;
      } else {
        row(s)[p] = (*allocated)[next++];
      }
    }
  }
  num_logical_tokens_ += num_new_tokens;
  return Status::ok();
}

Status PageTable::attach_prefix(std::span<const int32_t> pages, int32_t num_blocks,
                                int32_t num_pruned_tokens) {
  if (num_logical_tokens_ != 0) {
    return failed_precondition("page table: attach_prefix needs an empty table, it holds {} tokens",
                               num_logical_tokens_);
  }
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  if (num_blocks < 0 || pages.size() != num_streams * static_cast<size_t>(num_blocks)) {
    return invalid_argument("page table: prefix of {} blocks x {} streams given {} page ids",
                            num_blocks, num_streams, pages.size());
  }
  if (num_pruned_tokens < 0 ||
      num_blocks > (std::numeric_limits<int32_t>::max() - num_pruned_tokens) / layout_.page_size) {
    return out_of_range("page table: prefix of {} blocks and {} pruned tokens", num_blocks,
                        num_pruned_tokens);
  }
  for (int32_t id : pages) {
    if (!pool_->is_valid_id(id) || pool_->ref_count(id) == 0) {
      return failed_precondition(
          "page table: prefix page {} is not in use (was its radix node unlocked?)", id);
    }
  }
  ensure_stride(num_blocks);
  epoch_ = next_epoch();
  const int32_t num_tokens = num_blocks * layout_.page_size;
  for (size_t s = 0; s < num_streams; ++s) {
    for (int32_t b = 0; b < num_blocks; ++b) {
      const int32_t id = pages[s * static_cast<size_t>(num_blocks) + static_cast<size_t>(b)];
      pool_->retain(id);
      row(s)[b] = id;
    }
    num_tokens_[s] = num_tokens;
  }
  num_logical_tokens_ = num_tokens + num_pruned_tokens;
  return Status::ok();
}

Status PageTable::truncate(int32_t num_tokens) {
  if (num_tokens < 0 || num_tokens > num_logical_tokens_) {
    return out_of_range("page table: cannot truncate to {} tokens, the sequence has {}", num_tokens,
                        num_logical_tokens_);
  }
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  for (size_t s = 0; s < num_streams; ++s) {
    if (num_tokens < num_tokens_[s] && partial_page_shared(s, num_tokens)) {
      return failed_precondition(
          "page table: truncating stream {} to {} tokens leaves shared page {} partial", s,
          num_tokens, row(s)[num_tokens / layout_.page_size]);
    }
  }
  epoch_ = next_epoch();
  for (size_t s = 0; s < num_streams; ++s) {
    release_spare(s);
    if (num_tokens >= num_tokens_[s]) continue;
    // Release from the tail so the most recent pages are the first to be reused.
    for (int32_t p = pages_for(num_tokens_[s]) - 1; p >= pages_for(num_tokens); --p) {
      pool_->release(row(s)[p]);
    }
    num_tokens_[s] = num_tokens;
  }
  num_logical_tokens_ = num_tokens;
  return Status::ok();
}

Status PageTable::shrink_stream(int32_t layer, int32_t head, int32_t num_tokens) {
  SE_RETURN_IF_ERROR(check_stream(layer, head));
  const size_t s = stream_idx(layer, head);
  if (num_tokens < 0 || num_tokens > num_tokens_[s]) {
    return invalid_argument("page table: cannot shrink (layer {}, head {}) of {} tokens to {}", layer, head,
                            num_tokens_[s], num_tokens);
  }
  const int32_t num_kept_pages = pages_for(num_tokens);
  if (num_kept_pages < pages_for(num_tokens_[s])) {
    epoch_ = next_epoch();
    release_spare(s);
  }
  for (int32_t p = pages_for(num_tokens_[s]) - 1; p >= num_kept_pages; --p) pool_->release(row(s)[p]);
  num_tokens_[s] = num_tokens;
  return Status::ok();
}

Status PageTable::drop_last_slot(int32_t layer, int32_t head) {
  SE_RETURN_IF_ERROR(check_stream(layer, head));
  const size_t s = stream_idx(layer, head);
  if (num_tokens_[s] == 0)
    return invalid_argument("page table: (layer {}, head {}) has no slot to drop", layer, head);
  const int32_t num_tokens = num_tokens_[s] - 1;
  const int32_t emptied = pages_for(num_tokens);
  if (emptied < pages_for(num_tokens_[s])) {
    const int32_t page = row(s)[emptied];
    if (spare_[s] >= 0 || pool_->ref_count(page) != 1) {
      epoch_ = next_epoch();
      release_spare(s);
      pool_->release(page);
    } else {
      spare_[s] = page;
    }
  }
  num_tokens_[s] = num_tokens;
  return Status::ok();
}

void PageTable::release_spare(size_t stream) {
  if (spare_[stream] < 0) return;
  pool_->release(spare_[stream]);
  spare_[stream] = -1;
}

PageTable PageTable::clone() const {
  PageTable copy(pool_, layout_);
  copy.num_logical_tokens_ = num_logical_tokens_;
  copy.stride_ = stride_;
  copy.page_ids_ = page_ids_;
  copy.num_tokens_ = num_tokens_;
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  for (size_t s = 0; s < num_streams; ++s)
    for (int32_t p = 0; p < pages_for(num_tokens_[s]); ++p) pool_->retain(row(s)[p]);
  return copy;
}

PageTable PageTable::from_rows(BlockPool* pool, const KvLayout& layout, int32_t num_logical_tokens,
                               std::span<const int32_t> num_tokens, std::span<const int32_t> page_ids, int32_t stride) {
  PageTable table(pool, layout);
  const auto num_streams = static_cast<size_t>(layout.num_streams());
  SE_CHECK(num_tokens.size() == num_streams && page_ids.size() == num_streams * static_cast<size_t>(stride),
           "page table: {} lengths and {} ids for {} streams of stride {}", num_tokens.size(), page_ids.size(),
           num_streams, stride);
  table.num_logical_tokens_ = num_logical_tokens;
  table.stride_ = stride;
  table.page_ids_.assign(page_ids.begin(), page_ids.end());
  table.num_tokens_.assign(num_tokens.begin(), num_tokens.end());
  for (size_t s = 0; s < num_streams; ++s) {
    SE_CHECK(table.pages_for(num_tokens[s]) <= stride, "page table: stream {} of {} tokens over stride {}", s,
             num_tokens[s], stride);
    for (int32_t p = 0; p < table.pages_for(num_tokens[s]); ++p) {
      const int32_t id = table.row(s)[p];
      SE_CHECK(pool->is_valid_id(id) && pool->ref_count(id) > 0, "page table: page {} is not in use", id);
      pool->retain(id);
    }
  }
  return table;
}

void PageTable::free_all() {
  epoch_ = next_epoch();
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  for (size_t s = 0; s < num_streams; ++s) {
    release_spare(s);
    for (int32_t p = pages_for(num_tokens_[s]) - 1; p >= 0; --p) pool_->release(row(s)[p]);
    num_tokens_[s] = 0;
  }
  num_logical_tokens_ = 0;
}

PageTableView PageTable::view() const {
  return PageTableView{page_ids_.data(),      num_tokens_.data(),   stride_,
                       layout_.num_streams(), layout_.num_kv_heads, layout_.page_size};
}

Status PageTable::check_integrity() const {
  if (pool_ == nullptr) return Status::ok();  // moved-from: holds nothing
  const auto num_streams = static_cast<size_t>(layout_.num_streams());
  if (num_tokens_.size() != num_streams) {
    return internal_error("page table: {} lengths for {} streams", num_tokens_.size(), num_streams);
  }
  std::vector<int32_t> all;
  all.reserve(static_cast<size_t>(num_held_pages()));
  for (size_t s = 0; s < num_streams; ++s) {
    const int32_t n = num_tokens_[s];
    if (n < 0 || n > num_logical_tokens_) {
      return internal_error("page table: stream {} holds {} tokens, logical length is {}", s, n,
                            num_logical_tokens_);
    }
    if (pages_for(n) > stride_) {
      return internal_error("page table: stream {} needs {} pages, capacity is {}", s, pages_for(n),
                            stride_);
    }
    for (int32_t p = 0; p < pages_for(n); ++p) {
      const int32_t id = row(s)[p];
      if (!pool_->is_valid_id(id) || pool_->ref_count(id) == 0) {
        return internal_error("page table: stream {} page {} is id {}, not in use in the pool", s,
                              p, id);
      }
      all.push_back(id);
    }
    if (spare_[s] >= 0) {
      if (!pool_->is_valid_id(spare_[s]) || pool_->ref_count(spare_[s]) != 1)
        return internal_error("page table: stream {} spare page {} is not held by it alone", s, spare_[s]);
      all.push_back(spare_[s]);
    }
  }
  std::sort(all.begin(), all.end());
  const auto dup = std::adjacent_find(all.begin(), all.end());
  if (dup != all.end()) return internal_error("page table: page {} listed twice", *dup);
  return Status::ok();
}

}  // namespace se
