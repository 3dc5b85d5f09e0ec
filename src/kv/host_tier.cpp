#include "kv/host_tier.h"

#include "kv/page_table_transfer.h"

namespace se {

HostTier::HostTier(BlockPool* device_pool, BlockPool* host_pool)
    : device_pool_(device_pool),
      host_pool_(host_pool),
      lru_(device_pool->num_total_pages()),
      owner_(static_cast<size_t>(device_pool->num_total_pages()), -1) {}

std::vector<int32_t> HostTier::listed_pages(const PageTable& table) {
  std::vector<int32_t> pages;
  const KvLayout& layout = table.layout();
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
      const std::span<const int32_t> stream = table.pages(l, h);
      pages.insert(pages.end(), stream.begin(), stream.end());
      if (table.spare_page(l, h) >= 0) pages.push_back(table.spare_page(l, h));
    }
  }
  return pages;
}

void HostTier::track(int32_t seq, const PageTable& table) {
  for (int32_t page : listed_pages(table)) {
    owner_[static_cast<size_t>(page)] = seq;
    lru_.insert(page);
  }
}

void HostTier::untrack(const PageTable& table) {
  for (int32_t page : listed_pages(table)) {
    owner_[static_cast<size_t>(page)] = -1;
    lru_.erase(page);
  }
}

bool HostTier::is_resident(int32_t seq) const {
  const auto it = seqs_.find(seq);
  return it != seqs_.end() && it->second.resident;
}

Status HostTier::add(int32_t seq, PageTable&& table) {
  if (contains(seq)) return conflict("host tier: sequence {} is already held", seq);
  for (int32_t page : listed_pages(table)) {
    if (!device_pool_->is_valid_id(page) || owner_[static_cast<size_t>(page)] >= 0 ||
        device_pool_->ref_count(page) != 1)
      return failed_precondition("host tier: page {} of sequence {} is shared or not the device pool's", page, seq);
  }
  track(seq, table);
  seqs_.emplace(seq, Entry{std::move(table), true});
  return Status::ok();
}

Status HostTier::drop(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  if (it->second.resident) untrack(it->second.table);
  seqs_.erase(it);  // the table releases its pages
  return Status::ok();
}

Result<PageTable> HostTier::take(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  if (!it->second.resident) return failed_precondition("host tier: sequence {} is offloaded (retrieve it)", seq);
  untrack(it->second.table);
  PageTable table = std::move(it->second.table);
  seqs_.erase(it);
  return table;
}

Status HostTier::touch(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end() || !it->second.resident) return not_found("host tier: no resident sequence {}", seq);
  for (int32_t page : listed_pages(it->second.table)) lru_.touch(page);
  return Status::ok();
}

Status HostTier::offload(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end() || !it->second.resident) return not_found("host tier: no resident sequence {}", seq);
  SE_ASSIGN_OR_RETURN(PageTable copy, copy_page_table(it->second.table, *device_pool_, host_pool_));
  untrack(it->second.table);
  it->second.table = std::move(copy);  // the device table releases its pages
  it->second.resident = false;
  return Status::ok();
}

Status HostTier::retrieve(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.resident) return not_found("host tier: no offloaded sequence {}", seq);
  SE_ASSIGN_OR_RETURN(PageTable copy, copy_page_table(it->second.table, *host_pool_, device_pool_));
  it->second.table = std::move(copy);  // the host table releases its pages
  it->second.resident = true;
  track(seq, it->second.table);
  return Status::ok();
}

Result<std::vector<int32_t>> HostTier::make_room(int64_t num_pages) {
  std::vector<int32_t> offloaded;
  while (device_pool_->num_free_pages() < num_pages) {
    const std::optional<int32_t> victim = lru_.oldest();
    if (!victim)
      return resource_exhausted("host tier: {} device pages wanted, {} free and no resident sequence left", num_pages,
                                device_pool_->num_free_pages());
    const int32_t seq = owner_[static_cast<size_t>(*victim)];
    SE_RETURN_IF_ERROR(offload(seq));
    offloaded.push_back(seq);
  }
  return offloaded;
}

Status HostTier::check_integrity() const {
  SE_RETURN_IF_ERROR(device_pool_->check_integrity());
  SE_RETURN_IF_ERROR(host_pool_->check_integrity());
  SE_RETURN_IF_ERROR(lru_.check_integrity());
  int64_t resident_pages = 0;
  std::vector<uint8_t> seen_host(static_cast<size_t>(host_pool_->num_total_pages()), 0);
  for (const auto& [seq, entry] : seqs_) {
    SE_RETURN_IF_ERROR(entry.table.check_integrity());
    const BlockPool* pool = entry.resident ? device_pool_ : host_pool_;
    for (int32_t page : listed_pages(entry.table)) {
      if (!pool->is_valid_id(page) || pool->ref_count(page) == 0)
        return internal_error("host tier: sequence {} lists page {} not in use in its pool", seq, page);
      if (entry.resident) {
        if (owner_[static_cast<size_t>(page)] != seq || !lru_.contains(page))
          return internal_error("host tier: resident page {} of sequence {} not tracked as its own", page, seq);
        ++resident_pages;
      } else {
        if (seen_host[static_cast<size_t>(page)]) return internal_error("host tier: host page {} listed twice", page);
        seen_host[static_cast<size_t>(page)] = 1;
      }
    }
  }
  if (resident_pages != lru_.size())
    return internal_error("host tier: the LRU holds {} pages, the resident tables list {}", lru_.size(),
                          resident_pages);
  return Status::ok();
}

}  // namespace se
