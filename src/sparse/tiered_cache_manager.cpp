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
  const auto page_bytes = static_cast<int64_t>(layout().page_bytes());
  return (partitions_.index_bytes_for(num_tokens) + page_bytes - 1) / page_bytes;
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

std::unique_ptr<SequenceSnapshot> TieredCacheManager::snapshot(int32_t seq) {
  SE_CHECK(false, "tiered cache: sequence {} cannot be snapshot (Chain Cache does not run over the partitions)", seq);
  return nullptr;
}

Status TieredCacheManager::restore(int32_t seq, std::unique_ptr<SequenceSnapshot> /*snapshot*/) {
  return unimplemented(
      "tiered cache: sequence {} cannot resume a snapshot (Chain Cache does not run over the "
      "partitions)",
      seq);
}

Status TieredCacheManager::attend(int32_t seq, int layer, TensorView q, TensorView k, TensorView v, TensorView out,
                                  const AttentionParams& params, PartitionStep step) {
  if (sequences_.count(seq) == 0) return not_found("tiered cache: no sequence {}", seq);
  return partitions_.attend(seq, layer, q, k, v, out, params, step);
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
