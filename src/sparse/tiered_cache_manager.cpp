#include "sparse/tiered_cache_manager.h"

#include <algorithm>

#include "base/check.h"
#include "kv/pool_attention_view.h"

namespace se {

Result<std::unique_ptr<TieredCacheManager>> TieredCacheManager::create(const KvLayout& layout, int32_t num_pages,
                                                                       Allocator* allocator, int32_t num_host_pages,
                                                                       Allocator* host_allocator,
                                                                       const PartitionConfig& config,
                                                                       int32_t max_num_batched_tokens) {
  SE_RETURN_IF_ERROR(layout.validate());
  if (layout.store != KvStoreKind::kExplicit)
    return unimplemented("Spin's partitions read explicit K/V pages, not a {} store", kv_store_kind_name(layout.store));
  if (allocator == nullptr || allocator->device() != Device::kCpu || host_allocator == nullptr ||
      host_allocator->device() != Device::kCpu)
    return unimplemented("Spin's partitions run on the CPU backend only for now (their views carry host tables)");
  if (num_host_pages <= 0) return invalid_argument("Spin's partitions need a host tier (--kv-offloading-size)");
  SE_ASSIGN_OR_RETURN(std::unique_ptr<ArenaPageStorage> storage,
                      ArenaPageStorage::create(allocator, num_pages, layout.page_bytes()));
  SE_ASSIGN_OR_RETURN(std::unique_ptr<ArenaPageStorage> host_storage,
                      ArenaPageStorage::create(host_allocator, num_host_pages, layout.page_bytes()));
  return std::unique_ptr<TieredCacheManager>(
      new TieredCacheManager(layout, std::move(storage), std::move(host_storage), config, max_num_batched_tokens));
}

TieredCacheManager::TieredCacheManager(const KvLayout& layout, std::unique_ptr<PageStorage> storage,
                                       std::unique_ptr<PageStorage> host_storage, const PartitionConfig& config,
                                       int32_t max_num_batched_tokens)
    : CacheManager(layout),
      device_pool_(std::move(storage)),
      host_pool_(std::move(host_storage)),
      tier_(&device_pool_, &host_pool_),
      partitions_(&tier_, layout, config),
      max_num_batched_tokens_(max_num_batched_tokens) {}

int64_t TieredCacheManager::metadata_pages(int32_t num_tokens) const {
  const KvLayout& l = layout();
  const auto page_bytes = static_cast<int64_t>(l.page_bytes());
  const int64_t state =
      int64_t{l.num_streams()} * l.pages_per_stream(num_tokens) * partitions_.config().state_bytes_per_page;
  return (partitions_.index_bytes_for(num_tokens) + state + page_bytes - 1) / page_bytes;
}

int64_t TieredCacheManager::working_set_pages(int32_t num_tokens, int32_t step_tokens) const {
  const KvLayout& l = layout();
  // A step's new slots straddle at most one more page per stream than they fill.
  return std::max(int64_t{l.num_kv_heads} * l.pages_per_stream(num_tokens),
                  int64_t{l.num_streams()} * (l.pages_per_stream(step_tokens) + 1));
}

int64_t TieredCacheManager::num_available_pages() const {
  const int64_t offloadable = std::min<int64_t>(tier_.lru().size(), host_pool_.num_free_pages());
  return std::max<int64_t>(0, device_pool_.num_free_pages() + offloadable - partitions_.selection_pages());
}

int64_t TieredCacheManager::pages_to_reserve(int32_t seq, int32_t num_new_tokens) const {
  const int32_t num_tokens = num_logical_tokens(seq);
  const KvLayout& l = layout();
  const int64_t metadata =
      metadata_pages(num_tokens + num_new_tokens) - static_cast<int64_t>(sequence(seq).metadata_pages.size());
  return l.pages_for_tokens(num_tokens + num_new_tokens) - l.pages_for_tokens(num_tokens) + metadata;
}

int64_t TieredCacheManager::num_held_pages(int32_t seq) const {
  return tier_.table(seq).num_device_pages() + static_cast<int64_t>(sequence(seq).metadata_pages.size());
}

Status TieredCacheManager::check_can_ever_hold(int64_t peak_pages, int32_t max_num_tokens) const {
  const int64_t working_set = working_set_pages(max_num_tokens, std::min(max_num_tokens, max_num_batched_tokens_));
  const int64_t metadata = metadata_pages(max_num_tokens);
  if (working_set + metadata > num_total_pages())
    return resource_exhausted(
        "its working set on the device ({} pages: a layer read whole or a step's new pages) and its page metadata "
        "({} pages) exceed the device pool's {} pages",
        working_set, metadata, num_total_pages());
  const int64_t room = num_total_pages() + num_host_pages() - partitions_.selection_pages();
  if (peak_pages + metadata > room)
    return resource_exhausted(
        "its {} pages at its peak and {} pages of metadata exceed the {} the device pool and the host tier hold "
        "together (less one layer's selection kept free)",
        peak_pages, metadata, room);
  return Status::ok();
}

Status TieredCacheManager::hold_metadata_pages(std::vector<int32_t>& held, int64_t num_pages) {
  if (num_pages <= 0) return Status::ok();
  if (device_pool_.num_free_pages() < num_pages) SE_RETURN_IF_ERROR(tier_.make_room(num_pages).status());
  SE_ASSIGN_OR_RETURN(const std::vector<int32_t> pages, device_pool_.allocate(static_cast<int32_t>(num_pages)));
  held.insert(held.end(), pages.begin(), pages.end());
  num_metadata_pages_ += num_pages;
  return Status::ok();
}

Result<int32_t> TieredCacheManager::open(int32_t seq, std::span<const int32_t> /*prompt*/) {
  if (sequences_.count(seq) != 0) return conflict("tiered cache: sequence {} is already open", seq);
  Sequence sequence{.metadata_pages = {}, .positions = SlotPositions(layout().num_streams())};
  SE_RETURN_IF_ERROR(hold_metadata_pages(sequence.metadata_pages, metadata_pages(0)));
  Status added = tier_.add(seq, PageTable(&device_pool_, layout()));
  if (added.is_ok()) added = partitions_.add(seq, 0);
  if (!added.is_ok()) {
    if (tier_.contains(seq)) SE_CHECK(tier_.drop(seq).is_ok(), "tiered cache: dropping sequence {}", seq);
    device_pool_.release(sequence.metadata_pages);
    num_metadata_pages_ -= static_cast<int64_t>(sequence.metadata_pages.size());
    return added;
  }
  sequences_.emplace(seq, std::move(sequence));
  return 0;
}

Status TieredCacheManager::reserve(int32_t seq, int32_t num_new_tokens) {
  Sequence& s = sequence(seq);
  const int32_t num_tokens = num_logical_tokens(seq) + num_new_tokens;
  const int64_t new_metadata = metadata_pages(num_tokens) - static_cast<int64_t>(s.metadata_pages.size());
  const int64_t working_set = working_set_pages(num_tokens, num_new_tokens);
  if (working_set + num_metadata_pages_ + new_metadata > num_total_pages())
    return resource_exhausted(
        "tiered cache: sequence {}'s working set of {} pages does not fit the device pool's {} beside {} pages of "
        "metadata",
        seq, working_set, num_total_pages(), num_metadata_pages_ + new_metadata);
  if (pages_to_reserve(seq, num_new_tokens) > num_available_pages())
    return resource_exhausted("tiered cache: {} pages for {} tokens of sequence {}, {} available",
                              pages_to_reserve(seq, num_new_tokens), num_new_tokens, seq, num_available_pages());
  const size_t num_held = s.metadata_pages.size();
  SE_RETURN_IF_ERROR(hold_metadata_pages(s.metadata_pages, new_metadata));
  Status begun = partitions_.begin_step(seq, num_new_tokens);
  if (!begun.is_ok()) {
    device_pool_.release(std::span<const int32_t>(s.metadata_pages).subspan(num_held));
    num_metadata_pages_ -= static_cast<int64_t>(s.metadata_pages.size() - num_held);
    s.metadata_pages.resize(num_held);
    return begun;
  }
  s.positions.append(num_tokens - num_new_tokens, num_new_tokens);
  return Status::ok();
}

void TieredCacheManager::close(int32_t seq) {
  const auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  partitions_.remove(seq);
  SE_CHECK(tier_.drop(seq).is_ok(), "tiered cache: the tier lost sequence {}", seq);
  device_pool_.release(it->second.metadata_pages);
  num_metadata_pages_ -= static_cast<int64_t>(it->second.metadata_pages.size());
  sequences_.erase(it);
}

namespace {
// A sequence out of the tier: its table (its pages where they were, none in the LRU), its index and its metadata
// pages (the index and the method's state beside the pool). Offloaded = holding no device page: the pages and the
// index's resident part parked on the host (the method's state goes with the method's own snapshot). Holds its pages
// until restored or destroyed.
class TieredSnapshot final : public SequenceSnapshot {
 public:
  TieredSnapshot(const TieredCacheManager* cache, TieredPageTable table, PartitionedDecode::Index index,
                 std::vector<int32_t> metadata_pages, SlotPositions positions, const PartitionedDecode* partitions,
                 BlockPool* device_pool, BlockPool* host_pool)
      : cache(cache),
        table(std::move(table)),
        index(std::move(index)),
        metadata_pages(std::move(metadata_pages)),
        positions(std::move(positions)),
        partitions_(partitions),
        device_pool_(device_pool),
        host_pool_(host_pool) {}
  ~TieredSnapshot() override {
    device_pool_->release(metadata_pages);
    host_pool_->release(index.host_pages);
  }
  TieredSnapshot(const TieredSnapshot&) = delete;
  TieredSnapshot& operator=(const TieredSnapshot&) = delete;

  int32_t num_logical_tokens() const override { return table.num_logical_tokens(); }
  int64_t num_held_pages() const override {
    return table.num_device_pages() + static_cast<int64_t>(metadata_pages.size());
  }
  int64_t num_host_pages() const override {
    return table.num_host_pages() + static_cast<int64_t>(index.host_pages.size());
  }
  bool is_offloaded() const override { return num_held_pages() == 0; }
  // Metadata pages come back (a parked index into them); the KV pages come in as the partitions read them.
  int64_t num_pages_to_restore() const override {
    return cache->metadata_pages(num_logical_tokens()) - static_cast<int64_t>(metadata_pages.size());
  }
  // Each resident page takes a host page, and the index's resident part its pages' worth.
  int64_t num_host_pages_short() const override {
    return std::max<int64_t>(0, pages_to_park() - host_pool_->num_free_pages());
  }

  Status offload() override {
    if (is_offloaded()) return Status::ok();
    const std::vector<StreamPage> resident = table.pages_where(/*on_device=*/true);
    const int64_t needed = pages_to_park();
    if (num_host_pages() + needed > host_pool_->num_total_pages())
      return out_of_range("the host tier's {} pages can never hold a sequence of {} pages and {} of index",
                          host_pool_->num_total_pages(), table.num_device_pages() + table.num_host_pages(),
                          needed - static_cast<int64_t>(resident.size()));
    if (needed > host_pool_->num_free_pages())
      return resource_exhausted("the host tier has {} free pages, parking a sequence takes {}",
                                host_pool_->num_free_pages(), needed);
    // Room was checked: neither move fails.
    SE_CHECK(table.offload(resident).is_ok(), "tiered snapshot: offloading {} resident pages", resident.size());
    SE_CHECK(partitions_->offload_index(index, *host_pool_).is_ok(), "tiered snapshot: parking the index");
    device_pool_->release(metadata_pages);
    metadata_pages.clear();
    return Status::ok();
  }

  const TieredCacheManager* cache;  // the cache that took it
  TieredPageTable table;
  PartitionedDecode::Index index;
  std::vector<int32_t> metadata_pages;  // device pages held for the index and the state (none while parked)
  SlotPositions positions;

 private:
  // Host pages parking it takes: its resident pages and its index's.
  int64_t pages_to_park() const {
    if (is_offloaded()) return 0;
    return table.num_device_pages() + partitions_->index_pages(index, host_pool_->storage()->page_bytes());
  }

  const PartitionedDecode* partitions_;
  BlockPool* device_pool_;
  BlockPool* host_pool_;
};
}  // namespace

std::unique_ptr<SequenceSnapshot> TieredCacheManager::snapshot(int32_t seq) {
  auto it = sequences_.find(seq);
  SE_CHECK(it != sequences_.end(), "tiered cache: no sequence {} to snapshot", seq);
  Result<PartitionedDecode::Index> index = partitions_.take(seq);
  Result<TieredPageTable> table = tier_.detach(seq);
  SE_CHECK(index.is_ok() && table.is_ok(), "tiered cache: sequence {} lost its index or table", seq);
  num_metadata_pages_ -= static_cast<int64_t>(it->second.metadata_pages.size());
  auto snap =
      std::make_unique<TieredSnapshot>(this, std::move(*table), std::move(*index), std::move(it->second.metadata_pages),
                                       std::move(it->second.positions), &partitions_, &device_pool_, &host_pool_);
  sequences_.erase(it);
  return snap;
}

Status TieredCacheManager::restore(int32_t seq, std::unique_ptr<SequenceSnapshot> snapshot) {
  if (sequences_.count(seq) != 0) return conflict("tiered cache: sequence {} is already open", seq);
  auto* tiered = dynamic_cast<TieredSnapshot*>(snapshot.get());
  if (tiered == nullptr || tiered->cache != this)
    return invalid_argument("restore: the snapshot of sequence {} was not taken by this tiered cache", seq);
  // A parked sequence's metadata pages come back first (all or nothing: on error none is held), then its index.
  std::vector<int32_t> restored;
  SE_RETURN_IF_ERROR(hold_metadata_pages(restored, tiered->num_pages_to_restore()));
  if (!tiered->index.host_pages.empty())
    SE_CHECK(partitions_.retrieve_index(tiered->index, host_pool_).is_ok(), "tiered cache: index of sequence {}", seq);
  Sequence sequence{.metadata_pages = std::move(tiered->metadata_pages), .positions = std::move(tiered->positions)};
  tiered->metadata_pages.clear();
  num_metadata_pages_ += static_cast<int64_t>(sequence.metadata_pages.size());
  sequence.metadata_pages.insert(sequence.metadata_pages.end(), restored.begin(), restored.end());
  SE_CHECK(tier_.attach(seq, std::move(tiered->table)).is_ok(), "tiered cache: attaching sequence {}", seq);
  SE_CHECK(partitions_.put(seq, std::move(tiered->index)).is_ok(), "tiered cache: indexing sequence {}", seq);
  tiered->index.host_pages.clear();  // moved from: the snapshot releases nothing more
  sequences_.emplace(seq, std::move(sequence));
  return Status::ok();
}

Status TieredCacheManager::attend(int32_t seq, int layer, TensorView q, TensorView k, TensorView v, TensorView out,
                                  const AttentionParams& params, PartitionStep step,
                                  std::span<const std::span<const int32_t>> tokens) {
  if (sequences_.count(seq) == 0) return not_found("tiered cache: no sequence {}", seq);
  return partitions_.attend(seq, layer, q, k, v, out, params, step, tokens);
}

AttentionView TieredCacheManager::device_rows_view(int layer, std::span<const int32_t> seqs,
                                                   std::span<const int32_t> q_rows) {
  seq_views_.assign(seqs.size(), SeqKvView{});
  q_indptr_.assign(seqs.size() + 1, 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const PageTableView rows = tier_.table(seqs[i]).device_view();
    seq_views_[i].page_ids = rows.page_ids + static_cast<int64_t>(layout().stream(layer, 0)) * rows.stride;
    seq_views_[i].stride = rows.stride;
    seq_views_[i].num_tokens = rows.num_tokens + layout().stream(layer, 0);
    q_indptr_[i + 1] = q_indptr_[i] + q_rows[i];
  }
  return pool_attention_view(layout(), *device_pool_.storage(), seq_views_, q_indptr_.data());
}

AttentionView TieredCacheManager::build_view(int layer, const ForwardBatch& batch) {
  std::vector<int32_t> seqs, q_rows;
  for (const SequenceSlice& slice : batch.sequences) {
    seqs.push_back(slice.seq);
    q_rows.push_back(slice.num_tokens);
  }
  return device_rows_view(layer, seqs, q_rows);
}

AttentionView TieredCacheManager::build_sequence_view(int32_t seq, int layer) {
  const int32_t no_rows = 0;
  return device_rows_view(layer, {&seq, 1}, {&no_rows, 1});
}

int32_t TieredCacheManager::num_logical_tokens(int32_t seq) const { return tier_.table(seq).num_logical_tokens(); }

std::span<const int32_t> TieredCacheManager::slot_positions(int32_t seq, int layer, int kv_head) const {
  return sequence(seq).positions.of(layout().stream(layer, kv_head));
}

Status TieredCacheManager::evict_streams(int32_t seq, std::span<const StreamEviction> /*streams*/) {
  return unimplemented("tiered cache: Spin's partitions keep every token of sequence {}", seq);
}

Status TieredCacheManager::evict_slots(int32_t seq, std::span<const SlotEviction> /*streams*/) {
  return unimplemented("tiered cache: Spin's partitions keep every token of sequence {}", seq);
}

Status TieredCacheManager::check_integrity() const {
  SE_RETURN_IF_ERROR(tier_.check_integrity());
  int64_t num_metadata = 0;
  for (const auto& [seq, s] : sequences_) {
    if (!tier_.contains(seq)) return internal_error("tiered cache: the tier lost sequence {}", seq);
    if (static_cast<int64_t>(s.metadata_pages.size()) != metadata_pages(num_logical_tokens(seq)))
      return internal_error("tiered cache: sequence {} holds {} metadata pages, its index takes {}", seq,
                            s.metadata_pages.size(), metadata_pages(num_logical_tokens(seq)));
    for (int32_t page : s.metadata_pages)
      if (device_pool_.ref_count(page) != 1 || tier_.lru().contains(page))
        return internal_error("tiered cache: metadata page {} of sequence {} is shared or resident KV", page, seq);
    num_metadata += static_cast<int64_t>(s.metadata_pages.size());
  }
  if (num_metadata != num_metadata_pages_)
    return internal_error("tiered cache: {} metadata pages counted, {} held", num_metadata_pages_, num_metadata);
  return Status::ok();
}

}  // namespace se
