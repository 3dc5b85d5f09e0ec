// TieredCacheManager: the KV of running sequences spread page by page over the device pool and the host tier
// (Spin's hierarchy, kv/host_tier.h), for a method whose decode runs as Spin's partitions
// (MethodRuntime::partition_config). A sequence lives in the tier from its admission. reserve opens its step
// (new slots on the device, the device's least recently used pages going to the host for room); each layer then
// attends through PartitionedDecode: a prefill chunk and dense layers read the layer's pages whole, a
// decode step the method's selection, and only what is missing comes in from the host. So a sequence's KV may exceed
// the device pool: the device holds its working set, the host the rest.
//
// Device memory: the pool's pages hold resident KV, and each sequence's index (its pages' key bounds, kept where
// the pool lives) and what the method keeps for it beside the pool (PartitionConfig::state_bytes_per_page: a
// sketch of its keys) take pages' worth of the pool too, held out of it as the sequence grows (metadata pages): the
// MemoryOracle's answers below count both. A sequence is admitted when the device can hold its working set (a layer
// read whole, or a step's new pages, whichever is larger) beside its metadata, and the two pools its KV; one layer's
// selection stays free across the two pools, so a decode step's Retrieve moves in one copy. No radix prefix cache:
// a page belongs to one sequence; Chain Cache keeps a finished turn's sequence whole instead (snapshot), in the
// tier's pools. The partitions' views carry host tables, so this runs on the CPU backend (both pools in
// host memory). Engine thread only.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/host_tier.h"
#include "kv/slot_positions.h"
#include "sparse/cache_manager.h"
#include "sparse/partitioned_decode.h"

namespace se {

class TieredCacheManager final : public CacheManager {
 public:
  // A device pool of `num_pages` pages of `layout` from `allocator` and a host tier of `num_host_pages` from
  // `host_allocator`; steps of at most `max_num_batched_tokens` tokens. kUnimplemented for a store other than
  // explicit K/V or a pool off the CPU.
  static Result<std::unique_ptr<TieredCacheManager>> create(const KvLayout& layout, int32_t num_pages,
                                                            Allocator* allocator, int32_t num_host_pages,
                                                            Allocator* host_allocator, const PartitionConfig& config,
                                                            int32_t max_num_batched_tokens);

  int64_t num_total_pages() const override { return device_pool_.num_total_pages(); }
  int64_t num_free_pages() const override { return device_pool_.num_free_pages(); }
  // Free device pages, plus the resident pages the host tier has room to take, less one layer's selection.
  int64_t num_available_pages() const override;
  // Device pages in use: resident KV and metadata pages.
  int64_t num_used_pages() const override { return device_pool_.num_used_pages(); }
  int64_t num_host_pages() const override { return host_pool_.num_total_pages(); }
  int64_t num_free_host_pages() const override { return host_pool_.num_free_pages(); }
  // The step's new KV pages and the pages its index grows by.
  int64_t pages_to_reserve(int32_t seq, int32_t num_new_tokens) const override;
  // Its resident KV pages and its metadata pages.
  int64_t num_held_pages(int32_t seq) const override;
  Status check_can_ever_hold(int64_t peak_pages, int32_t max_num_tokens) const override;

  // Device pages the index of a sequence of `num_tokens` tokens and the method's state for it take.
  int64_t metadata_pages(int32_t num_tokens) const;
  // Device pages a sequence of `num_tokens` tokens, in steps of at most `step_tokens`, needs resident at once: a
  // layer's pages read whole (a prefill chunk, a dense layer), or a step's new pages in every stream.
  int64_t working_set_pages(int32_t num_tokens, int32_t step_tokens) const;

  // Opens an empty sequence in the tier (no prefix is ever cached: returns 0); its first metadata pages come out of
  // the device pool (kResourceExhausted when it lacks them, nothing held).
  Result<int32_t> open(int32_t seq, std::span<const int32_t> prompt) override;
  // Opens the sequence's step of `num_new_tokens` tokens. kResourceExhausted, nothing changed, when the device
  // cannot hold the sequence's working set beside every sequence's metadata, or the two pools its new pages.
  Status reserve(int32_t seq, int32_t num_new_tokens) override;
  void on_computed(int32_t /*seq*/, std::span<const int32_t> /*tokens*/, int32_t /*num_computed*/) override {}
  void close(int32_t seq) override;
  // Takes the sequence out of the tier as it stands (its pages where they are, out of the LRU's reach), with its
  // index and metadata pages: a finished Chain Cache turn, or a preempted request kept for later. The snapshot's
  // offload parks it all on the host tier (the pages, and the index's part kept where the pool lives), releasing
  // its device pages.
  std::unique_ptr<SequenceSnapshot> snapshot(int32_t seq) override;
  // Puts a snapshot of this cache back under `seq`, as it stands: a parked index comes back into metadata pages
  // (making room by the LRU), the pages stay where they are and the partitions bring them in as steps read them.
  // kConflict for an open seq, kInvalidArgument for another cache's snapshot, kResourceExhausted (the snapshot
  // destroyed) when the device cannot hold the index.
  Status restore(int32_t seq, std::unique_ptr<SequenceSnapshot> snapshot) override;
  bool runs_on_host_tier() const override { return true; }

  // Layer `layer` of the sequence's open step (reserve): writes k, v [n, Hkv, D] and attends, out [n, H, D] from
  // q [n, H, D], over the method's `tokens` under method_tokens, as PartitionedDecode::attend.
  Status attend(int32_t seq, int layer, TensorView q, TensorView k, TensorView v, TensorView out,
                const AttentionParams& params, PartitionStep step,
                std::span<const std::span<const int32_t>> tokens = {});
  const PartitionConfig& partition_config() const { return partitions_.config(); }
  // What the sequence's open step moved so far.
  const PartitionStepCounts& step_counts(int32_t seq) const { return partitions_.step_counts(seq); }
  const HostTier& tier() const { return tier_; }

  // The resident part of the layer: entries of pages on the host read -1. Attention goes through attend instead.
  AttentionView build_view(int layer, const ForwardBatch& batch) override;
  AttentionView build_sequence_view(int32_t seq, int layer) override;
  // Pages move between the pools inside every forward: each call answers a new epoch.
  uint64_t table_epoch(int32_t /*seq*/) const override { return ++epoch_; }
  int32_t num_logical_tokens(int32_t seq) const override;
  // Every slot holds its position: the partitions keep every token.
  std::span<const int32_t> slot_positions(int32_t seq, int layer, int kv_head) const override;
  Status evict_streams(int32_t seq, std::span<const StreamEviction> streams) override;
  Status evict_slots(int32_t seq, std::span<const SlotEviction> streams) override;

  // The pools, the tier (every table and its LRU), every sequence's index and metadata pages.
  Status check_integrity() const override;

 private:
  TieredCacheManager(const KvLayout& layout, std::unique_ptr<PageStorage> storage,
                     std::unique_ptr<PageStorage> host_storage, const PartitionConfig& config,
                     int32_t max_num_batched_tokens);
  // Takes `num_pages` more device pages for the sequence's metadata, making room by the tier's LRU; nothing taken
  // on error.
  Status hold_metadata_pages(std::vector<int32_t>& held, int64_t num_pages);
  // A view of the sequences' device rows with each sequence's last `q_rows[i]` slots as its new rows.
  AttentionView device_rows_view(int layer, std::span<const int32_t> seqs, std::span<const int32_t> q_rows);

  BlockPool device_pool_;
  BlockPool host_pool_;
  HostTier tier_;
  PartitionedDecode partitions_;
  int32_t max_num_batched_tokens_;
  struct Sequence {
    std::vector<int32_t> metadata_pages;  // device pages held for its index
    SlotPositions positions;
  };
  Sequence& sequence(int32_t seq) { return sequences_.at(seq); }
  const Sequence& sequence(int32_t seq) const { return sequences_.at(seq); }

  std::unordered_map<int32_t, Sequence> sequences_;
  int64_t num_metadata_pages_ = 0;  // over every open sequence
  mutable uint64_t epoch_ = 0;
  std::vector<SeqKvView> seq_views_;  // scratch of the views
  std::vector<int32_t> q_indptr_;     // scratch of the views
};

}  // namespace se
