#include "kv/host_tier.h"

#include "base/check.h"

namespace se {

HostTier::HostTier(BlockPool* device_pool, BlockPool* host_pool)
    : device_pool_(device_pool),
      host_pool_(host_pool),
      lru_(device_pool->num_total_pages()),
      owner_(static_cast<size_t>(device_pool->num_total_pages())) {}

void HostTier::track(int32_t seq, const TieredPageTable& table, std::span<const StreamPage> pages) {
  for (const StreamPage& page : pages) {
    const int32_t id = table.device_page(page);
    owner_[static_cast<size_t>(id)] = Owner{seq, page};
    lru_.insert(id);
  }
}

void HostTier::untrack(std::span<const int32_t> device_pages) {
  for (int32_t id : device_pages) {
    owner_[static_cast<size_t>(id)] = Owner{};
    lru_.erase(id);
  }
}

bool HostTier::is_resident(int32_t seq) const {
  const auto it = seqs_.find(seq);
  return it != seqs_.end() && it->second.num_host_pages() == 0;
}

Status HostTier::add(int32_t seq, PageTable&& table) {
  if (contains(seq)) return conflict("host tier: sequence {} is already held", seq);
  const KvLayout& layout = table.layout();
  for (int32_t l = 0; l < layout.num_layers; ++l) {
    for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
      for (int32_t page : table.pages(l, h)) {
        if (!device_pool_->is_valid_id(page) || owner_[static_cast<size_t>(page)].seq >= 0 ||
            device_pool_->ref_count(page) != 1)
          return failed_precondition("host tier: page {} of sequence {} is shared or not the device pool's", page, seq);
      }
    }
  }
  const auto [it, inserted] = seqs_.emplace(seq, TieredPageTable(table, device_pool_, host_pool_));
  table.free_all();  // the tier's table holds the pages now; spares go back
  track(seq, it->second, it->second.pages_where(/*on_device=*/true));
  return Status::ok();
}

Status HostTier::drop(int32_t seq) {
  return detach(seq).status();  // the table handed out releases its pages
}

Result<PageTable> HostTier::take(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  if (it->second.num_host_pages() > 0)
    return failed_precondition("host tier: {} pages of sequence {} are on the host (retrieve them)",
                               it->second.num_host_pages(), seq);
  PageTable table = it->second.to_page_table();
  SE_RETURN_IF_ERROR(drop(seq));
  return table;
}

Result<TieredPageTable> HostTier::detach(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  std::vector<int32_t> resident;
  for (const StreamPage& page : it->second.pages_where(/*on_device=*/true))
    resident.push_back(it->second.device_page(page));
  untrack(resident);
  TieredPageTable table = std::move(it->second);
  seqs_.erase(it);
  return table;
}

Status HostTier::attach(int32_t seq, TieredPageTable&& table) {
  if (contains(seq)) return conflict("host tier: sequence {} is already held", seq);
  const auto [it, inserted] = seqs_.emplace(seq, std::move(table));
  track(seq, it->second, it->second.pages_where(/*on_device=*/true));
  return Status::ok();
}

Status HostTier::touch(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  for (const StreamPage& page : it->second.pages_where(/*on_device=*/true)) lru_.touch(it->second.device_page(page));
  return Status::ok();
}

Status HostTier::touch(int32_t seq, std::span<const StreamPage> pages) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  const TieredPageTable& table = it->second;
  for (const StreamPage& page : pages) {
    if (page.stream < 0 || page.stream >= table.layout().num_streams() || page.page_idx < 0 ||
        page.page_idx >= table.num_pages(page.stream) || table.device_page(page) < 0)
      return invalid_argument("host tier: page {} of stream {} of sequence {} is not resident", page.page_idx,
                              page.stream, seq);
  }
  for (const StreamPage& page : pages) lru_.touch(table.device_page(page));
  return Status::ok();
}

Status HostTier::offload(int32_t seq, std::span<const StreamPage> pages) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  SE_ASSIGN_OR_RETURN(const std::vector<int32_t> released, it->second.offload(pages));
  untrack(released);
  return Status::ok();
}

Status HostTier::retrieve(int32_t seq, std::span<const StreamPage> pages) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  SE_RETURN_IF_ERROR(it->second.retrieve(pages).status());
  track(seq, it->second, pages);
  return Status::ok();
}

Status HostTier::offload(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  return offload(seq, it->second.pages_where(/*on_device=*/true));
}

Status HostTier::retrieve(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  return retrieve(seq, it->second.pages_where(/*on_device=*/false));
}

Result<int64_t> HostTier::offload_oldest(int32_t seq, int64_t num_pages) {
  if (!contains(seq)) return not_found("host tier: no sequence {}", seq);
  std::vector<StreamPage> victims;
  lru_.for_each_oldest_first([&](int32_t id) {
    if (static_cast<int64_t>(victims.size()) >= num_pages) return false;
    if (owner_[static_cast<size_t>(id)].seq == seq) victims.push_back(owner_[static_cast<size_t>(id)].page);
    return true;
  });
  SE_RETURN_IF_ERROR(offload(seq, victims));
  return static_cast<int64_t>(victims.size());
}

Status HostTier::append(int32_t seq, int32_t num_new_tokens) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("host tier: no sequence {}", seq);
  SE_ASSIGN_OR_RETURN(const std::vector<StreamPage> new_pages, it->second.append(num_new_tokens));
  track(seq, it->second, new_pages);
  return Status::ok();
}

Result<int64_t> HostTier::make_room(int64_t num_pages) {
  const int64_t needed = num_pages - device_pool_->num_free_pages();
  if (needed <= 0) return int64_t{0};
  if (needed > lru_.size() || needed > host_pool_->num_free_pages())
    return resource_exhausted("host tier: {} device pages wanted, {} free, {} resident, {} free on the host", num_pages,
                              device_pool_->num_free_pages(), lru_.size(), host_pool_->num_free_pages());
  // The victims, oldest first, gathered per sequence so each sequence's pages move in one copy.
  std::map<int32_t, std::vector<StreamPage>> victims;
  for (int64_t i = 0; i < needed; ++i) {
    const int32_t id = *lru_.oldest();
    const Owner owner = owner_[static_cast<size_t>(id)];
    untrack({&id, 1});
    victims[owner.seq].push_back(owner.page);
  }
  for (const auto& [seq, pages] : victims) {
    // Room was checked and the pages are resident: the move cannot fail.
    const auto moved = seqs_.at(seq).offload(pages);
    SE_CHECK(moved.is_ok(), "host tier: offloading LRU victims of sequence {}: {}", seq, moved.status().to_string());
  }
  return needed;
}

Status HostTier::check_integrity() const {
  SE_RETURN_IF_ERROR(device_pool_->check_integrity());
  SE_RETURN_IF_ERROR(host_pool_->check_integrity());
  SE_RETURN_IF_ERROR(lru_.check_integrity());
  int64_t resident_pages = 0;
  for (const auto& [seq, table] : seqs_) {
    SE_RETURN_IF_ERROR(table.check_integrity());
    for (const StreamPage& page : table.pages_where(/*on_device=*/true)) {
      const int32_t id = table.device_page(page);
      const Owner& owner = owner_[static_cast<size_t>(id)];
      if (owner.seq != seq || owner.page.stream != page.stream || owner.page.page_idx != page.page_idx ||
          !lru_.contains(id))
        return internal_error("host tier: resident page {} of sequence {} not tracked as its own", id, seq);
      if (device_pool_->ref_count(id) != 1)
        return internal_error("host tier: resident page {} of sequence {} is shared", id, seq);
      ++resident_pages;
    }
  }
  if (resident_pages != lru_.size())
    return internal_error("host tier: the LRU holds {} pages, the tables list {} resident", lru_.size(),
                          resident_pages);
  return Status::ok();
}

}  // namespace se
