// PagedCacheManager: K/V in per-(layer, KV head) pages of one BlockPool. Full-history methods (dense and
// dynamic selection) keep every token resident and share a radix prefix cache over full blocks, so requests with a
// common prompt prefix reuse its pages; eviction methods run it without the prefix cache and compact their
// streams in place (evict). The layout's store kind (kv/kv_store_kind.h) says what the pages hold: explicit K/V,
// or FP8 codes with per-(layer, KV head) scales fixed by the first batch each layer writes (kv/fp8_scale_table.h);
// the views are then kQuantized and eviction and the prefix caches move the codes as they are. A TurboQuant store
// encodes each written token into its slot (backend/quant/turboquant_kv.h; the paper's store turboquant_prod_kv.h,
// with each layer's outlier channels fixed by its first batch, kv/turboquant_channel_table.h); its tokens are coded
// on their own, so
// the radix cache shares its pages as they are, while eviction and pruning, which move rows of the explicit
// layout, refuse it. An optional host tier (a second pool of the same pages in host memory: pinned beside a GPU)
// takes snapshots' pages when they are offloaded (kv/page_table_transfer.h copies them; restore brings them back)
// and the radix cache's evicted blocks. Engine thread only.
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/attention_view.h"
#include "backend/ops.h"
#include "backend/quant/turboquant_kv.h"
#include "backend/quant/turboquant_prod_kv.h"
#include "kv/block_pool.h"
#include "kv/fp8_scale_table.h"
#include "kv/turboquant_channel_table.h"
#include "kv/page_table.h"
#include "kv/radix_cache.h"
#include "kv/slot_positions.h"
#include "loader/kv_cache_scales.h"
#include "sparse/cache_manager.h"

namespace se {

class PagedCacheManager final : public CacheManager {
 public:
  // A pool of `num_pages` pages of `layout` from `allocator`, and a host tier of `num_host_pages` pages from
  // `host_allocator` (none when 0). An FP8 store decodes with `fp8_scales` (nullable: calibrated instead).
  static Result<std::unique_ptr<PagedCacheManager>> create(const KvLayout& layout, int32_t num_pages,
                                                           Allocator* allocator, bool enable_prefix_caching,
                                                           int32_t num_host_pages = 0,
                                                           Allocator* host_allocator = nullptr,
                                                           const KvCacheScales* fp8_scales = nullptr);

  int64_t num_total_pages() const override { return pool_.num_total_pages(); }
  int64_t num_available_pages() const override;
  int64_t num_used_pages() const override;
  int64_t pages_to_reserve(int32_t seq, int32_t num_new_tokens) const override;
  int64_t num_held_pages(int32_t seq) const override;
  int64_t num_host_pages() const override { return host_pool_ ? host_pool_->num_total_pages() : 0; }
  int64_t num_free_host_pages() const override { return host_pool_ ? host_pool_->num_free_pages() : 0; }

  Result<int32_t> open(int32_t seq, std::span<const int32_t> prompt) override;
  Status reserve(int32_t seq, int32_t num_new_tokens) override;
  void on_computed(int32_t seq, std::span<const int32_t> tokens, int32_t num_computed) override;
  void close(int32_t seq) override;
  std::unique_ptr<SequenceSnapshot> snapshot(int32_t seq) override;
  Status restore(int32_t seq, std::unique_ptr<SequenceSnapshot> snapshot) override;

  AttentionView build_view(int layer, const ForwardBatch& batch) override;
  void write(int layer, const AttentionView& view, TensorView k, TensorView v) override;
  AttentionView build_sequence_view(int32_t seq, int layer) override;
  void visit_retrieved_pages(int32_t seq, const PagesRewrittenFn& pages_retrieved) override;
  uint64_t table_epoch(int32_t seq) const override { return sequence(seq).table.epoch(); }
  int32_t num_logical_tokens(int32_t seq) const override;
  std::span<const int32_t> slot_positions(int32_t seq, int layer, int kv_head) const override;
  Status evict_streams(int32_t seq, std::span<const StreamEviction> streams) override;
  Status evict_slots(int32_t seq, std::span<const SlotEviction> streams) override;
  Status truncate(int32_t seq, int32_t num_tokens) override;

  Result<RadixCache::PrefixMatch> inspect_prefix(std::span<const int32_t> tokens) const override;
  Status check_prunable(std::span<const int32_t> tokens, RadixCache::BlockRange blocks) const override;
  Result<int32_t> prune_prefix(std::span<const int32_t> tokens, RadixCache::BlockRange blocks,
                               std::span<const int32_t> kept_positions,
                               const PagesRewrittenFn& pages_rewritten) override;

  PrefixCacheCounters prefix_cache_counters() const override {
    return radix_ ? PrefixCacheCounters{radix_->num_query_tokens(), radix_->num_hit_tokens()} : PrefixCacheCounters{};
  }
  int64_t num_free_pages() const override { return pool_.num_free_pages(); }
  const PageTable* table(int32_t seq) const;

  Status check_integrity() const override;

 private:
  struct Sequence {
    PageTable table;
    SlotPositions positions;
    RadixCache::NodeId locked_node = RadixCache::kRootNode;  // pins the cached blocks this sequence uses
    int32_t num_cached_blocks = 0;                            // leading blocks already in the radix cache
    // Blocks of the attached prefix whose KV was pruned away: later blocks sit that many pages earlier.
    int32_t num_unresident_blocks = 0;
    int32_t num_retrieved_blocks = 0;  // the attached prefix's last blocks, brought back from the host tier
  };

  PagedCacheManager(const KvLayout& layout, std::unique_ptr<PageStorage> storage, bool enable_prefix_caching,
                    std::unique_ptr<PageStorage> host_storage);
  Sequence& sequence(int32_t seq);
  const Sequence& sequence(int32_t seq) const;
  // Checks that stream (layer, kv_head) exists and marks it in stream_listed_: kInvalidArgument when it does not,
  // or was marked before (evict_streams and evict_slots take each stream once).
  Status list_stream_once(int32_t seq, int layer, int kv_head);
  // A view of layer `layer` (its FP8 scales) over the sequences whose SeqKvViews and row offsets are in
  // `seq_views` and `q_indptr`.
  AttentionView make_view(int layer, const std::vector<SeqKvView>& seq_views,
                          const std::vector<int32_t>& q_indptr) const;
  // Encodes the view's new tokens (the last n slots of each stream) of layer `layer` into their TurboQuant slots.
  void write_turboquant(int layer, const AttentionView& view, TensorView k, TensorView v) const;

  BlockPool pool_;
  std::unique_ptr<BlockPool> host_pool_;  // the host tier; null without one
  std::unique_ptr<RadixCache> radix_;  // null when prefix caching is off
  std::optional<Fp8ScaleTable> fp8_scales_;                    // the FP8 store's scales; empty for explicit pages
  std::optional<TurboQuantKvCodec> turboquant_;                // a TurboQuant preset's codec
  std::optional<TurboQuantProdKvCodec> turboquant_prod_;       // the paper's TurboQuant store's codec
  std::optional<TurboQuantChannelTable> turboquant_channels_;  // and its outlier channels
  std::unordered_map<int32_t, Sequence> sequences_;
  std::vector<int32_t> q_indptr_;      // scratch of build_view
  std::vector<SeqKvView> seq_views_;   // scratch of build_view
  std::vector<int32_t> one_q_indptr_ = {0, 0};  // scratch of build_sequence_view
  std::vector<SeqKvView> one_seq_view_;        // scratch of build_sequence_view
  std::vector<StreamCompaction> compactions_;  // scratch of evict_streams
  std::vector<KvRowMove> row_moves_;           // scratch of evict_slots
  std::vector<uint8_t> stream_listed_;         // scratch of evict_streams and evict_slots: [num_streams]
};

}  // namespace se
