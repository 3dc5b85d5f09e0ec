#include "kv/tiered_page_table.h"

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "kv/page_table_transfer.h"

namespace se {

TieredPageTable::TieredPageTable(const PageTable& table, BlockPool* device_pool, BlockPool* host_pool)
    : device_pool_(device_pool),
      host_pool_(host_pool),
      layout_(table.layout()),
      num_logical_tokens_(table.num_logical_tokens()) {
  const int32_t num_streams = layout_.num_streams();
  for (int32_t s = 0; s < num_streams; ++s)
    stride_ = std::max(stride_, table.num_pages(s / layout_.num_kv_heads, s % layout_.num_kv_heads));
  num_tokens_.resize(static_cast<size_t>(num_streams));
  device_ids_.assign(static_cast<size_t>(num_streams) * static_cast<size_t>(stride_), -1);
  host_ids_.assign(device_ids_.size(), -1);
  for (int32_t s = 0; s < num_streams; ++s) {
    const int32_t layer = s / layout_.num_kv_heads, head = s % layout_.num_kv_heads;
    num_tokens_[static_cast<size_t>(s)] = table.num_tokens(layer, head);
    const std::span<const int32_t> pages = table.pages(layer, head);
    for (size_t p = 0; p < pages.size(); ++p) {
      device_pool_->retain(pages[p]);
      device_ids_[entry({s, static_cast<int32_t>(p)})] = pages[p];
    }
    num_device_pages_ += static_cast<int64_t>(pages.size());
  }
}

TieredPageTable::~TieredPageTable() {
  if (device_pool_ != nullptr) release_all();
}

TieredPageTable::TieredPageTable(TieredPageTable&& other) noexcept
    : device_pool_(std::exchange(other.device_pool_, nullptr)),
      host_pool_(std::exchange(other.host_pool_, nullptr)),
      layout_(other.layout_),
      num_logical_tokens_(other.num_logical_tokens_),
      stride_(other.stride_),
      num_tokens_(std::move(other.num_tokens_)),
      device_ids_(std::move(other.device_ids_)),
      host_ids_(std::move(other.host_ids_)),
      num_device_pages_(std::exchange(other.num_device_pages_, 0)),
      num_host_pages_(std::exchange(other.num_host_pages_, 0)) {}

void TieredPageTable::release_all() {
  for (int32_t id : device_ids_)
    if (id >= 0) device_pool_->release(id);
  for (int32_t id : host_ids_)
    if (id >= 0) host_pool_->release(id);
  std::fill(device_ids_.begin(), device_ids_.end(), -1);
  std::fill(host_ids_.begin(), host_ids_.end(), -1);
  num_device_pages_ = num_host_pages_ = 0;
}

int32_t TieredPageTable::num_pages(int32_t stream) const {
  return static_cast<int32_t>(layout_.pages_per_stream(num_tokens(stream)));
}

std::vector<StreamPage> TieredPageTable::pages_where(bool on_device) const {
  std::vector<StreamPage> pages;
  for (int32_t s = 0; s < layout_.num_streams(); ++s)
    for (int32_t p = 0; p < num_pages(s); ++p)
      if ((device_page({s, p}) >= 0) == on_device) pages.push_back({s, p});
  return pages;
}

Result<std::vector<int32_t>> TieredPageTable::offload(std::span<const StreamPage> pages) {
  return move(pages, /*to_host=*/true);
}

Result<std::vector<int32_t>> TieredPageTable::retrieve(std::span<const StreamPage> pages) {
  return move(pages, /*to_host=*/false);
}

Result<std::vector<int32_t>> TieredPageTable::move(std::span<const StreamPage> pages, bool to_host) {
  std::vector<int32_t>& from_ids = to_host ? device_ids_ : host_ids_;
  std::vector<int32_t>& to_ids = to_host ? host_ids_ : device_ids_;
  BlockPool* from_pool = to_host ? device_pool_ : host_pool_;
  BlockPool* to_pool = to_host ? host_pool_ : device_pool_;
  const char* from_name = to_host ? "device" : "host";
  std::vector<int32_t> from_pages;
  from_pages.reserve(pages.size());
  for (const StreamPage& page : pages) {
    if (page.stream < 0 || page.stream >= layout_.num_streams() || page.page_idx < 0 ||
        page.page_idx >= num_pages(page.stream))
      return invalid_argument("tiered page table: no page {} in stream {}", page.page_idx, page.stream);
    const int32_t id = from_ids[entry(page)];
    if (id < 0)
      return failed_precondition("tiered page table: page {} of stream {} is not on the {}", page.page_idx, page.stream,
                                 from_name);
    from_pages.push_back(id);
  }
  std::vector<int32_t> sorted = from_pages;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return invalid_argument("tiered page table: a page is listed twice");
  if (from_pool->storage() == nullptr || to_pool->storage() == nullptr)
    return invalid_argument("tiered page table: a pool without page storage");
  SE_ASSIGN_OR_RETURN(std::vector<int32_t> to_pages, to_pool->allocate(static_cast<int32_t>(pages.size())));
  copy_storage_pages(*from_pool->storage(), *to_pool->storage(), from_pages, to_pages);
  for (size_t i = 0; i < pages.size(); ++i) {
    to_ids[entry(pages[i])] = to_pages[i];
    from_ids[entry(pages[i])] = -1;
    from_pool->release(from_pages[i]);
  }
  const auto moved = static_cast<int64_t>(pages.size());
  num_device_pages_ += to_host ? -moved : moved;
  num_host_pages_ += to_host ? moved : -moved;
  return from_pages;
}

void TieredPageTable::grow_rows(int32_t stride) {
  std::vector<int32_t> device_ids(static_cast<size_t>(layout_.num_streams()) * static_cast<size_t>(stride), -1);
  std::vector<int32_t> host_ids(device_ids.size(), -1);
  for (int32_t s = 0; s < layout_.num_streams(); ++s) {
    const size_t from = static_cast<size_t>(s) * static_cast<size_t>(stride_);
    const size_t to = static_cast<size_t>(s) * static_cast<size_t>(stride);
    std::copy_n(device_ids_.begin() + static_cast<std::ptrdiff_t>(from), stride_, device_ids.begin() + to);
    std::copy_n(host_ids_.begin() + static_cast<std::ptrdiff_t>(from), stride_, host_ids.begin() + to);
  }
  device_ids_ = std::move(device_ids);
  host_ids_ = std::move(host_ids);
  stride_ = stride;
}

Result<std::vector<StreamPage>> TieredPageTable::append(int32_t num_new_tokens) {
  if (num_new_tokens < 0) return invalid_argument("tiered page table: cannot append {} tokens", num_new_tokens);
  std::vector<StreamPage> new_pages;
  int32_t widest = stride_;
  for (int32_t s = 0; s < layout_.num_streams(); ++s) {
    const int32_t have = num_pages(s);
    const auto need = static_cast<int32_t>(layout_.pages_per_stream(num_tokens(s) + num_new_tokens));
    for (int32_t p = have; p < need; ++p) new_pages.push_back({s, p});
    widest = std::max(widest, need);
  }
  SE_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, device_pool_->allocate(static_cast<int32_t>(new_pages.size())));
  // Grown geometrically, as PageTable's rows are, so a decoding sequence re-lays them out rarely.
  if (widest > stride_) grow_rows(std::max(widest, stride_ + stride_ / 2));
  for (size_t i = 0; i < new_pages.size(); ++i) device_ids_[entry(new_pages[i])] = ids[i];
  for (int32_t& n : num_tokens_) n += num_new_tokens;
  num_logical_tokens_ += num_new_tokens;
  num_device_pages_ += static_cast<int64_t>(new_pages.size());
  return new_pages;
}

PageTableView TieredPageTable::device_view() const {
  return PageTableView{device_ids_.data(),    num_tokens_.data(),   stride_,
                       layout_.num_streams(), layout_.num_kv_heads, layout_.page_size};
}

PageTable TieredPageTable::to_page_table() const {
  SE_CHECK(num_host_pages_ == 0, "tiered page table: {} pages are still on the host", num_host_pages_);
  return PageTable::from_rows(device_pool_, layout_, num_logical_tokens_, num_tokens_, device_ids_, stride_);
}

Status TieredPageTable::check_integrity() const {
  if (device_pool_ == nullptr) return Status::ok();  // moved-from: holds nothing
  std::vector<int32_t> device_pages, host_pages;
  for (int32_t s = 0; s < layout_.num_streams(); ++s) {
    if (num_tokens(s) < 0 || num_tokens(s) > num_logical_tokens_ || num_pages(s) > stride_)
      return internal_error("tiered page table: stream {} holds {} tokens", s, num_tokens(s));
    for (int32_t p = 0; p < stride_; ++p) {
      const int32_t device_id = device_ids_[entry({s, p})], host_id = host_ids_[entry({s, p})];
      if (p >= num_pages(s)) {
        if (device_id >= 0 || host_id >= 0)
          return internal_error("tiered page table: stream {} lists a page past its end", s);
        continue;
      }
      if ((device_id >= 0) == (host_id >= 0))
        return internal_error("tiered page table: page {} of stream {} is in {} pools", p, s,
                              device_id >= 0 ? "both" : "neither of the");
      const BlockPool* pool = device_id >= 0 ? device_pool_ : host_pool_;
      const int32_t id = device_id >= 0 ? device_id : host_id;
      if (!pool->is_valid_id(id) || pool->ref_count(id) == 0)
        return internal_error("tiered page table: page {} of stream {} is id {}, not in use", p, s, id);
      (device_id >= 0 ? device_pages : host_pages).push_back(id);
    }
  }
  if (static_cast<int64_t>(device_pages.size()) != num_device_pages_ ||
      static_cast<int64_t>(host_pages.size()) != num_host_pages_)
    return internal_error("tiered page table: {} device and {} host pages listed, counted {} and {}",
                          device_pages.size(), host_pages.size(), num_device_pages_, num_host_pages_);
  for (std::vector<int32_t>* ids : {&device_pages, &host_pages}) {
    std::sort(ids->begin(), ids->end());
    if (const auto dup = std::adjacent_find(ids->begin(), ids->end()); dup != ids->end())
      return internal_error("tiered page table: page {} listed twice", *dup);
  }
  return Status::ok();
}

}  // namespace se
