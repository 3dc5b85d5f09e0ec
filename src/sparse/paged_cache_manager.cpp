#include "sparse/paged_cache_manager.h"

#include <algorithm>

#include "base/check.h"
#include "backend/ops.h"
#include "kv/page_table_transfer.h"
#include "kv/pool_attention_view.h"

namespace se {

namespace {
// Pruning scores a prefix's tokens per KV head and moves their K/V rows; a latent store has neither (and a low-rank
// latent's key is rotated at its slot, which pruning would change).
Status no_latent_pruning(KvStoreKind store) {
  return unimplemented(
      "prefix pruning does not run over a latent store ({}) yet: a shared-latent or low-rank row holds no per-head K/V",
      kv_store_kind_name(store));
}
}  // namespace

Result<std::unique_ptr<PagedCacheManager>> PagedCacheManager::create(const KvLayout& layout, int32_t num_pages,
                                                                     Allocator* allocator, bool enable_prefix_caching,
                                                                     int32_t num_host_pages, Allocator* host_allocator,
                                                                     const KvCacheScales* fp8_scales) {
  SE_RETURN_IF_ERROR(layout.validate());
  if (fp8_scales != nullptr && layout.store != KvStoreKind::kFp8E4M3)
    return invalid_argument("FP8 KV cache scales were given to a {} store", kv_store_kind_name(layout.store));
  if (fp8_scales != nullptr && (fp8_scales->num_kv_heads != layout.num_kv_heads ||
                                fp8_scales->k.size() != static_cast<size_t>(layout.num_streams())))
    return invalid_argument("FP8 KV cache scales for {} KV heads, {} values, do not fit {} layers of {} KV heads",
                            fp8_scales->num_kv_heads, fp8_scales->k.size(), layout.num_layers, layout.num_kv_heads);
  if (layout.turboquant() && (allocator == nullptr || allocator->device() != Device::kCpu))
    return unimplemented("the {} KV store runs on the CPU only", kv_store_kind_name(layout.store));
  SE_ASSIGN_OR_RETURN(std::unique_ptr<ArenaPageStorage> storage,
                      ArenaPageStorage::create(allocator, num_pages, layout.page_bytes()));
  std::unique_ptr<ArenaPageStorage> host_storage;
  if (num_host_pages > 0) {
    if (host_allocator == nullptr || host_allocator->device() != Device::kCpu)
      return invalid_argument("the host tier's {} pages need a host memory allocator", num_host_pages);
    SE_ASSIGN_OR_RETURN(host_storage, ArenaPageStorage::create(host_allocator, num_host_pages, layout.page_bytes()));
  }
  auto cache = std::unique_ptr<PagedCacheManager>(
      new PagedCacheManager(layout, std::move(storage), enable_prefix_caching, std::move(host_storage)));
  if (fp8_scales != nullptr)
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      const size_t at = static_cast<size_t>(layer) * static_cast<size_t>(layout.num_kv_heads);
      cache->fp8_scales_->fix(layer, fp8_scales->k.data() + at, fp8_scales->v.data() + at);
    }
  return cache;
}

PagedCacheManager::PagedCacheManager(const KvLayout& layout, std::unique_ptr<PageStorage> storage,
                                     bool enable_prefix_caching, std::unique_ptr<PageStorage> host_storage)
    : CacheManager(layout),
      pool_(std::move(storage)),
      host_pool_(host_storage ? std::make_unique<BlockPool>(std::move(host_storage)) : nullptr) {
  if (enable_prefix_caching) radix_ = std::make_unique<RadixCache>(&pool_, layout, host_pool_.get());
  if (layout.store == KvStoreKind::kFp8E4M3)
    fp8_scales_.emplace(layout.num_layers, layout.num_kv_heads, pool_.storage()->device());
  if (!layout.turboquant()) return;
  const TurboQuantKvFormat format = turboquant_format(layout.store);
  if (!format.outlier_split) {
    turboquant_.emplace(layout.head_dim, format);
    return;
  }
  turboquant_prod_.emplace(layout.head_dim, format.key_bits);
  turboquant_channels_.emplace(layout.num_layers, layout.num_kv_heads, layout.head_dim);
}

namespace {
class PagedSnapshot final : public SequenceSnapshot {
 public:
  PagedSnapshot(PageTable table, SlotPositions positions, BlockPool* device_pool, BlockPool* host_pool)
      : table(std::move(table)), positions(std::move(positions)), device_pool_(device_pool), host_pool_(host_pool) {}
  int32_t num_logical_tokens() const override { return table.num_logical_tokens(); }
  int64_t num_held_pages() const override { return on_host ? 0 : table.num_held_pages(); }
  int64_t num_host_pages() const override { return on_host ? table.num_held_pages() : 0; }
  int64_t num_pages_to_restore() const override { return on_host ? pages_to_copy_page_table(table) : 0; }
  bool is_offloaded() const override { return on_host; }
  int64_t num_host_pages_short() const override {
    if (host_pool_ == nullptr || on_host) return 0;
    return std::max<int64_t>(0, pages_to_copy_page_table(table) - host_pool_->num_free_pages());
  }

  Status offload() override {
    if (host_pool_ == nullptr) return unimplemented("no host tier to offload to (--kv-offloading-size)");
    if (on_host) return Status::ok();
    const int64_t needed = pages_to_copy_page_table(table);
    if (needed > host_pool_->num_total_pages())
      return out_of_range("the host tier's {} pages can never hold a snapshot of {}", host_pool_->num_total_pages(),
                          needed);
    SE_ASSIGN_OR_RETURN(PageTable copy, copy_page_table(table, *device_pool_, host_pool_));
    table = std::move(copy);  // the device pages go back to the pool
    on_host = true;
    return Status::ok();
  }
  // Back into the device pool. Precondition: on_host.
  Status retrieve() {
    SE_ASSIGN_OR_RETURN(PageTable copy, copy_page_table(table, *host_pool_, device_pool_));
    table = std::move(copy);
    on_host = false;
    return Status::ok();
  }

  PageTable table;  // over the device pool, or over the host tier's once offloaded
  SlotPositions positions;
  bool on_host = false;

 private:
  BlockPool* device_pool_;
  BlockPool* host_pool_;  // null without a host tier
};
}  // namespace

PagedCacheManager::Sequence& PagedCacheManager::sequence(int32_t seq) {
  auto it = sequences_.find(seq);
  SE_CHECK(it != sequences_.end(), "sequence {} is not open", seq);
  return it->second;
}

const PagedCacheManager::Sequence& PagedCacheManager::sequence(int32_t seq) const {
  auto it = sequences_.find(seq);
  SE_CHECK(it != sequences_.end(), "sequence {} is not open", seq);
  return it->second;
}

const PageTable* PagedCacheManager::table(int32_t seq) const {
  auto it = sequences_.find(seq);
  return it == sequences_.end() ? nullptr : &it->second.table;
}

int64_t PagedCacheManager::num_available_pages() const {
  return pool_.num_free_pages() + (radix_ ? radix_->num_evictable_pages() : 0);
}

int64_t PagedCacheManager::num_used_pages() const {
  return pool_.num_used_pages() - (radix_ ? radix_->num_evictable_pages() : 0);
}

int64_t PagedCacheManager::pages_to_reserve(int32_t seq, int32_t num_new_tokens) const {
  return sequence(seq).table.num_pages_for_append(num_new_tokens);
}

int64_t PagedCacheManager::num_held_pages(int32_t seq) const { return sequence(seq).table.num_held_pages(); }

int32_t PagedCacheManager::num_logical_tokens(int32_t seq) const {
  return sequence(seq).table.num_logical_tokens();
}

std::span<const int32_t> PagedCacheManager::slot_positions(int32_t seq, int layer, int kv_head) const {
  return sequence(seq).positions.of(layout().stream(layer, kv_head));
}

Result<int32_t> PagedCacheManager::open(int32_t seq, std::span<const int32_t> prompt) {
  if (sequences_.count(seq) != 0) return failed_precondition("sequence {} is already open", seq);
  Sequence& s =
      sequences_.emplace(seq, Sequence{PageTable(&pool_, layout()), SlotPositions(layout().num_streams())})
          .first->second;
  if (!radix_) return 0;
  RadixCache::PrefixMatch match = radix_->match_prefix(prompt);
  if (match.num_blocks() == 0) return 0;
  radix_->lock(match.last_node());
  s.locked_node = match.last_node();
  s.num_cached_blocks = match.num_blocks();
  s.num_unresident_blocks = match.num_blocks() - match.num_resident_blocks;
  s.num_retrieved_blocks = match.num_retrieved_blocks;
  SE_RETURN_IF_ERROR(s.table.attach_prefix(match.pages, match.num_resident_blocks,
                                           s.num_unresident_blocks * layout().page_size));
  s.positions.attach(match.resident_positions);
  return match.num_cached_tokens;
}

Status PagedCacheManager::reserve(int32_t seq, int32_t num_new_tokens) {
  Sequence& s = sequence(seq);
  const int64_t needed = s.table.num_pages_for_append(num_new_tokens);
  if (needed > pool_.num_free_pages() && radix_) radix_->evict(static_cast<int32_t>(needed - pool_.num_free_pages()));
  const int32_t first_position = s.table.num_logical_tokens();
  SE_RETURN_IF_ERROR(s.table.append(num_new_tokens));
  s.positions.append(first_position, num_new_tokens);
  return Status::ok();
}

void PagedCacheManager::on_computed(int32_t seq, std::span<const int32_t> tokens, int32_t num_computed) {
  if (!radix_) return;
  Sequence& s = sequence(seq);
  const int32_t num_full_blocks = num_computed / layout().page_size;
  if (num_full_blocks <= s.num_cached_blocks) return;
  auto inserted = radix_->insert(tokens.first(static_cast<size_t>(num_full_blocks) * layout().page_size),
                                 s.table.view(), s.num_unresident_blocks);
  SE_CHECK(inserted.is_ok(), "radix insert: {}", inserted.status().to_string());
  // Pin the new deepest node before releasing the old pin, so no block of this sequence becomes evictable.
  radix_->lock(inserted->last_node);
  if (s.locked_node != RadixCache::kRootNode) radix_->unlock(s.locked_node);
  s.locked_node = inserted->last_node;
  s.num_cached_blocks = num_full_blocks;
}

void PagedCacheManager::close(int32_t seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  if (radix_ && it->second.locked_node != RadixCache::kRootNode) radix_->unlock(it->second.locked_node);
  sequences_.erase(it);  // the page table releases its pages
}

std::unique_ptr<SequenceSnapshot> PagedCacheManager::snapshot(int32_t seq) {
  Sequence& s = sequence(seq);
  auto snap = std::make_unique<PagedSnapshot>(std::move(s.table), std::move(s.positions), &pool_, host_pool_.get());
  close(seq);
  return snap;
}

Status PagedCacheManager::restore(int32_t seq, std::unique_ptr<SequenceSnapshot> snapshot) {
  if (sequences_.count(seq) != 0) return failed_precondition("sequence {} is already open", seq);
  auto* paged = dynamic_cast<PagedSnapshot*>(snapshot.get());
  if (paged == nullptr) return invalid_argument("restore: the snapshot was not taken by a paged cache");
  if (paged->on_host) {
    const int64_t needed = paged->num_pages_to_restore();
    if (needed > pool_.num_free_pages() && radix_) radix_->evict(static_cast<int32_t>(needed - pool_.num_free_pages()));
    SE_RETURN_IF_ERROR(paged->retrieve());
  }
  sequences_.emplace(seq, Sequence{std::move(paged->table), std::move(paged->positions)});
  return Status::ok();
}

AttentionView PagedCacheManager::make_view(int layer, const std::vector<SeqKvView>& seq_views,
                                           const std::vector<int32_t>& q_indptr) const {
  const KvLayout& l = layout();
  AttentionView view = pool_attention_view(l, *pool_.storage(), seq_views, q_indptr.data());
  if (fp8_scales_) {
    view.payload = KvPayload::kQuantized;
    view.quantized.scheme = KvQuantScheme::kFp8E4M3;
    view.quantized.k_scales = fp8_scales_->k_scales(layer);
    view.quantized.v_scales = fp8_scales_->v_scales(layer);
  }
  if (turboquant_) {
    const TurboQuantKvFormat& format = turboquant_->format();
    view.payload = KvPayload::kQuantized;
    view.quantized.scheme = KvQuantScheme::kTurboQuant;
    view.quantized.bits = format.key_bits;
    view.quantized.value_bits = format.value_bits;
    view.quantized.norm_correction = format.norm_correction;
    if (!format.key_fp8()) {
      view.quantized.rotation = turboquant_->rotation().data();
      view.quantized.centroids = turboquant_->centroids().data();
    }
  }
  if (turboquant_prod_) {
    view.payload = KvPayload::kQuantized;
    view.quantized.scheme = KvQuantScheme::kTurboQuant;
    view.quantized.bits = view.quantized.value_bits = turboquant_prod_->bits();
    view.quantized.turboquant_prod = &*turboquant_prod_;
    view.quantized.key_orders = turboquant_channels_->key_orders(layer);
    view.quantized.value_orders = turboquant_channels_->value_orders(layer);
  }
  if (l.shared_latent()) view.payload = KvPayload::kSharedLatent;
  if (l.low_rank_latent()) view.payload = KvPayload::kLowRankLatent;  // the method's factors fill view.latent
  return view;
}

void PagedCacheManager::write_turboquant(int layer, const AttentionView& view, TensorView k, TensorView v) const {
  const int32_t dim = view.head_dim, heads = view.num_kv_heads;
  SE_CHECK(k.device == Device::kCpu && v.device == Device::kCpu && k.dtype == DType::kF32 && v.dtype == DType::kF32,
           "turboquant cache: writes f32 rows on the CPU");
  SE_CHECK(k.numel() == int64_t{view.q_indptr[view.num_seqs]} * heads * dim && v.numel() == k.numel(),
           "turboquant cache: k {} and v {} for {} rows of {} KV heads x {}", k.shape.to_string(), v.shape.to_string(),
           view.q_indptr[view.num_seqs], heads, dim);
  const size_t slot_bytes = turboquant_ ? turboquant_->layout().slot_bytes() : turboquant_prod_->layout().slot_bytes();
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const int32_t n = view.q_indptr[s + 1] - view.q_indptr[s];
#pragma omp parallel for schedule(static)
    for (int32_t h = 0; h < heads; ++h) {
      const int32_t len = view.seqs[s].num_tokens[h];
      const int32_t* pages = view.seqs[s].page_ids + static_cast<int64_t>(h) * view.seqs[s].stride;
      for (int32_t r = 0; r < n; ++r) {
        // The sequence's new tokens are the last n slots of the stream.
        const int32_t slot = len - n + r;
        const int64_t source = (int64_t{view.q_indptr[s] + r} * heads + h) * dim;
        const float *k_row = k.ptr<const float>() + source, *v_row = v.ptr<const float>() + source;
        uint8_t* to = static_cast<uint8_t*>(view.kv_base) +
                      static_cast<size_t>(pages[slot / view.page_size]) * view.page_bytes +
                      static_cast<size_t>(slot % view.page_size) * slot_bytes;
        if (turboquant_) {
          turboquant_->encode(k_row, v_row, to);
        } else {
          turboquant_prod_->encode(k_row, v_row, turboquant_channels_->key_orders(layer) + int64_t{h} * dim,
                                   turboquant_channels_->value_orders(layer) + int64_t{h} * dim, to);
        }
      }
    }
  }
}

void PagedCacheManager::write(int layer, const AttentionView& view, TensorView k, TensorView v) {
  // The split is fixed by the layer's first batch, before its rows are encoded; the view reads it through its
  // pointers.
  if (turboquant_channels_) turboquant_channels_->calibrate(layer, k, v);
  if (layout().turboquant()) {
    write_turboquant(layer, view, k, v);
    return;
  }
  // The scales are read through the view's pointers, so fixing them here reaches the view already built.
  if (fp8_scales_) fp8_scales_->calibrate(layer, k, v);
  write_kv(view, k, v);
}

AttentionView PagedCacheManager::build_view(int layer, const ForwardBatch& batch) {
  q_indptr_.assign(1, 0);
  seq_views_.clear();
  for (const SequenceSlice& slice : batch.sequences) {
    const PageTableView t = sequence(slice.seq).table.view();
    q_indptr_.push_back(q_indptr_.back() + slice.num_tokens);
    seq_views_.push_back(SeqKvView{t.pages(layer, 0), t.stride, t.num_tokens + t.stream(layer, 0)});
  }
  return make_view(layer, seq_views_, q_indptr_);
}

AttentionView PagedCacheManager::build_sequence_view(int32_t seq, int layer) {
  const PageTableView t = sequence(seq).table.view();
  one_seq_view_.assign(1, SeqKvView{t.pages(layer, 0), t.stride, t.num_tokens + t.stream(layer, 0)});
  return make_view(layer, one_seq_view_, one_q_indptr_);
}

void PagedCacheManager::visit_retrieved_pages(int32_t seq, const PagesRewrittenFn& pages_retrieved) {
  const Sequence& s = sequence(seq);
  if (s.num_retrieved_blocks == 0) return;
  // The retrieved blocks end the attached prefix, which is all the sequence holds until its first forward.
  const std::vector<int32_t> q_indptr = {0, s.num_retrieved_blocks * layout().page_size};
  const PageTableView t = s.table.view();
  for (int layer = 0; layer < layout().num_layers; ++layer) {
    const std::vector<SeqKvView> one = {SeqKvView{t.pages(layer, 0), t.stride, t.num_tokens + t.stream(layer, 0)}};
    pages_retrieved(layer, make_view(layer, one, q_indptr));
  }
}

Status PagedCacheManager::list_stream_once(int32_t seq, int layer, int kv_head) {
  const KvLayout& l = layout();
  if (layer < 0 || layer >= l.num_layers || kv_head < 0 || kv_head >= l.num_kv_heads)
    return invalid_argument("evict: sequence {} has no stream (layer {}, head {})", seq, layer, kv_head);
  uint8_t& listed = stream_listed_[static_cast<size_t>(l.stream(layer, kv_head))];
  if (listed != 0) return invalid_argument("evict: stream (layer {}, head {}) listed twice", layer, kv_head);
  listed = 1;
  return Status::ok();
}

Status PagedCacheManager::evict_streams(int32_t seq, std::span<const StreamEviction> streams) {
  Sequence& s = sequence(seq);
  const KvLayout& l = layout();
  stream_listed_.assign(static_cast<size_t>(l.num_streams()), 0);
  for (const StreamEviction& e : streams) {
    SE_RETURN_IF_ERROR(list_stream_once(seq, e.layer, e.kv_head));
    // Compaction rewrites pages in place, so none may be shared (eviction methods run without prefix caching).
    for (int32_t page : s.table.pages(e.layer, e.kv_head))
      if (pool_.ref_count(page) != 1)
        return failed_precondition("evict: sequence {} (layer {}, head {}) shares page {}", seq, e.layer, e.kv_head,
                                   page);
    const int32_t len = s.table.num_tokens(e.layer, e.kv_head);
    for (size_t i = 0; i < e.kept.size(); ++i)
      if (e.kept[i] < 0 || e.kept[i] >= len || (i > 0 && e.kept[i] <= e.kept[i - 1]))
        return invalid_argument("evict: kept indices must ascend within [0, {}), got {} at {}", len, e.kept[i], i);
  }
  compactions_.clear();
  for (const StreamEviction& e : streams)
    compactions_.push_back(StreamCompaction{s.table.pages(e.layer, e.kv_head).data(), e.kept});
  compact_kv(build_sequence_view(seq, 0), compactions_);
  for (const StreamEviction& e : streams) {
    SE_RETURN_IF_ERROR(s.table.shrink_stream(e.layer, e.kv_head, static_cast<int32_t>(e.kept.size())));
    s.positions.keep(l.stream(e.layer, e.kv_head), e.kept);
  }
  return Status::ok();
}

Status PagedCacheManager::evict_slots(int32_t seq, std::span<const SlotEviction> streams) {
  Sequence& s = sequence(seq);
  const KvLayout& l = layout();
  stream_listed_.assign(static_cast<size_t>(l.num_streams()), 0);
  row_moves_.clear();
  for (const SlotEviction& e : streams) {
    SE_RETURN_IF_ERROR(list_stream_once(seq, e.layer, e.kv_head));
    const int32_t last = s.table.num_tokens(e.layer, e.kv_head) - 1;
    if (e.slot < 0 || e.slot > last)
      return invalid_argument("evict: stream (layer {}, head {}) holds {} slots, has no slot {}", e.layer, e.kv_head,
                              last + 1, e.slot);
    if (e.slot == last) continue;
    const PageSlot hole = s.table.slot(e.layer, e.kv_head, e.slot);
    // The move rewrites the hole's page in place, so no one else may hold it.
    if (pool_.ref_count(hole.page_id) != 1)
      return failed_precondition("evict: sequence {} (layer {}, head {}) shares page {}", seq, e.layer, e.kv_head,
                                 hole.page_id);
    const PageSlot source = s.table.slot(e.layer, e.kv_head, last);
    row_moves_.push_back(KvRowMove{source.page_id, source.offset, hole.page_id, hole.offset});
  }
  move_kv_rows(build_sequence_view(seq, 0), row_moves_);
  for (const SlotEviction& e : streams) {
    SE_RETURN_IF_ERROR(s.table.drop_last_slot(e.layer, e.kv_head));
    s.positions.move_last_into(l.stream(e.layer, e.kv_head), e.slot);
  }
  return Status::ok();
}

Status PagedCacheManager::truncate(int32_t seq, int32_t num_tokens) {
  Sequence& s = sequence(seq);
  const int32_t num_logical = s.table.num_logical_tokens();
  if (num_tokens < 0 || num_tokens > num_logical)
    return out_of_range("truncate: sequence {} has {} tokens, cannot keep {}", seq, num_logical, num_tokens);
  const int32_t num_dropped = num_logical - num_tokens;
  if (num_dropped == 0) return Status::ok();
  if (num_tokens < s.num_cached_blocks * layout().page_size)
    return failed_precondition("truncate: sequence {} to {} tokens cuts into its {} prefix-cached blocks", seq,
                               num_tokens, s.num_cached_blocks);
  const KvLayout& l = layout();
  for (int layer = 0; layer < l.num_layers; ++layer)
    for (int h = 0; h < l.num_kv_heads; ++h)
      if (s.table.num_tokens(layer, h) < num_dropped)
        return failed_precondition("truncate: sequence {} (layer {}, head {}) holds {} tokens, fewer than the {} "
                                   "to drop", seq, layer, h, s.table.num_tokens(layer, h), num_dropped);
  // Each stream keeps its leading slots (a compacted stream is shorter than the logical length, so the
  // table's own truncate, which cuts at a logical position, would keep its newest tokens); then only the
  // logical length moves back.
  for (int layer = 0; layer < l.num_layers; ++layer)
    for (int h = 0; h < l.num_kv_heads; ++h)
      SE_RETURN_IF_ERROR(s.table.shrink_stream(layer, h, s.table.num_tokens(layer, h) - num_dropped));
  SE_RETURN_IF_ERROR(s.table.truncate(num_tokens));
  s.positions.drop_last(num_dropped);
  return Status::ok();
}

Result<RadixCache::PrefixMatch> PagedCacheManager::inspect_prefix(std::span<const int32_t> tokens) const {
  if (!radix_) return unimplemented("prefix caching is off: there is no radix prefix cache to inspect");
  return radix_->peek_prefix(tokens);
}

Status PagedCacheManager::check_prunable(std::span<const int32_t> tokens, RadixCache::BlockRange blocks) const {
  if (!radix_) return unimplemented("prefix caching is off: there is no radix prefix cache to prune");
  if (layout().one_row_per_token()) return no_latent_pruning(layout().store);
  return radix_->prunable_nodes(tokens, blocks.first_block, blocks.end_block).status();
}

Result<int32_t> PagedCacheManager::prune_prefix(std::span<const int32_t> tokens, RadixCache::BlockRange blocks,
                                                std::span<const int32_t> kept_positions,
                                                const PagesRewrittenFn& pages_rewritten) {
  if (!radix_) return unimplemented("prefix caching is off: there is no radix prefix cache to prune");
  if (layout().one_row_per_token()) return no_latent_pruning(layout().store);
  SE_ASSIGN_OR_RETURN(std::vector<RadixCache::NodeId> nodes,
                      radix_->prunable_nodes(tokens, blocks.first_block, blocks.end_block));
  const KvLayout& l = layout();
  const int32_t first_token = blocks.first_block * l.page_size;
  const auto num_blocks = static_cast<int32_t>(nodes.size());
  const auto num_kept = static_cast<int32_t>(kept_positions.size());
  if (num_kept % l.page_size != 0 || num_kept > num_blocks * l.page_size)
    return invalid_argument("prune: {} kept positions are not a whole number of the {} pages", num_kept, num_blocks);
  std::vector<int32_t> kept(kept_positions.begin(), kept_positions.end());
  for (size_t i = 0; i < kept.size(); ++i) {
    kept[i] -= first_token;  // relative to the segment's first token
    if (kept[i] < 0 || kept[i] >= num_blocks * l.page_size || (i > 0 && kept[i] <= kept[i - 1]))
      return invalid_argument("prune: kept positions must ascend inside [{}, {}), got {} at {}", first_token,
                              first_token + num_blocks * l.page_size, kept_positions[i], i);
  }
  // Per layer, one sequence over the segment's pages (every KV head a stream of num_blocks full pages); the
  // kept tokens move to its front, in order, so they land in the pages of the first blocks (every stream of every
  // layer in one compaction). The same pages with the kept tokens as new rows tell the method which pages were
  // rewritten.
  std::vector<int32_t> pages(static_cast<size_t>(l.num_streams()) * static_cast<size_t>(num_blocks));  // [stream][n]
  compactions_.clear();
  for (int32_t stream = 0; stream < l.num_streams(); ++stream) {
    int32_t* stream_pages = pages.data() + static_cast<size_t>(stream) * num_blocks;
    for (int32_t b = 0; b < num_blocks; ++b)
      stream_pages[b] = radix_->node_page(nodes[static_cast<size_t>(b)], stream);
    compactions_.push_back(StreamCompaction{stream_pages, kept});
  }
  const std::vector<int32_t> segment_lengths(static_cast<size_t>(l.num_kv_heads), num_blocks * l.page_size);
  const std::vector<SeqKvView> pool_geometry = {SeqKvView{pages.data(), num_blocks, segment_lengths.data()}};
  const std::vector<int32_t> no_rows = {0, 0};
  compact_kv(make_view(0, pool_geometry, no_rows), compactions_);
  if (pages_rewritten && num_kept > 0) {
    const std::vector<int32_t> kept_lengths(static_cast<size_t>(l.num_kv_heads), num_kept);
    const std::vector<int32_t> rewritten_q_indptr = {0, num_kept};
    for (int layer = 0; layer < l.num_layers; ++layer) {
      const std::vector<SeqKvView> rewritten = {
          SeqKvView{pages.data() + static_cast<size_t>(l.stream(layer, 0)) * num_blocks, num_blocks, kept_lengths.data()}};
      pages_rewritten(layer, make_view(layer, rewritten, rewritten_q_indptr));
    }
  }
  return radix_->commit_prune(nodes, kept);
}

Status PagedCacheManager::check_integrity() const {
  SE_RETURN_IF_ERROR(pool_.check_integrity());
  if (host_pool_) SE_RETURN_IF_ERROR(host_pool_->check_integrity().with_context("host tier"));
  if (radix_) SE_RETURN_IF_ERROR(radix_->check_integrity());
  const KvLayout& l = layout();
  for (const auto& [seq, s] : sequences_) {
    SE_RETURN_IF_ERROR(s.table.check_integrity().with_context(fmt::format("sequence {}", seq)));
    for (int layer = 0; layer < l.num_layers; ++layer)
      for (int h = 0; h < l.num_kv_heads; ++h)
        if (static_cast<int32_t>(s.positions.of(l.stream(layer, h)).size()) != s.table.num_tokens(layer, h))
          return internal_error("sequence {} (layer {}, head {}): the position map holds {} slots, the stream {}",
                                seq, layer, h, s.positions.of(l.stream(layer, h)).size(), s.table.num_tokens(layer, h));
  }
  return Status::ok();
}

}  // namespace se
