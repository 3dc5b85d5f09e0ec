#include "sparse/paged_cache_manager.h"

#include "base/check.h"

namespace se {

Result<std::unique_ptr<PagedCacheManager>> PagedCacheManager::create(const KvLayout& layout, int32_t num_pages,
                                                                     Allocator* allocator,
                                                                     bool enable_prefix_caching) {
  SE_RETURN_IF_ERROR(layout.validate());
  SE_ASSIGN_OR_RETURN(std::unique_ptr<ArenaPageStorage> storage,
                      ArenaPageStorage::create(allocator, num_pages, layout.page_bytes()));
  return std::unique_ptr<PagedCacheManager>(
      new PagedCacheManager(layout, std::move(storage), enable_prefix_caching));
}

PagedCacheManager::PagedCacheManager(const KvLayout& layout, std::unique_ptr<PageStorage> storage,
                                     bool enable_prefix_caching)
    : CacheManager(layout), pool_(std::move(storage)) {
  if (enable_prefix_caching) radix_ = std::make_unique<RadixCache>(&pool_, layout);
}

PagedCacheManager::Sequence& PagedCacheManager::sequence(int32_t seq) {
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

int64_t PagedCacheManager::pages_to_reserve(int32_t seq, int32_t num_new_tokens) const {
  auto it = sequences_.find(seq);
  SE_CHECK(it != sequences_.end(), "sequence {} is not open", seq);
  return it->second.table.num_pages_for_append(num_new_tokens);
}

int64_t PagedCacheManager::peak_pages(int32_t num_prompt_tokens, int32_t max_new_tokens) const {
  return layout().pages_per_stream(num_prompt_tokens + max_new_tokens) * layout().num_streams();
}

Result<int32_t> PagedCacheManager::open(int32_t seq, std::span<const int32_t> prompt) {
  if (sequences_.count(seq) != 0) return failed_precondition("sequence {} is already open", seq);
  Sequence& s = sequences_.emplace(seq, Sequence{PageTable(&pool_, layout())}).first->second;
  if (!radix_) return 0;
  RadixCache::PrefixMatch match = radix_->match_prefix(prompt);
  if (match.num_blocks() == 0) return 0;
  radix_->lock(match.last_node());
  s.locked_node = match.last_node();
  s.num_cached_blocks = match.num_blocks();
  SE_RETURN_IF_ERROR(s.table.attach_prefix(match.pages, match.num_blocks()));
  return match.num_cached_tokens;
}

Status PagedCacheManager::reserve(int32_t seq, int32_t num_new_tokens) {
  Sequence& s = sequence(seq);
  const int64_t needed = s.table.num_pages_for_append(num_new_tokens);
  if (needed > pool_.num_free_pages() && radix_) radix_->evict(static_cast<int32_t>(needed - pool_.num_free_pages()));
  return s.table.append(num_new_tokens);
}

void PagedCacheManager::on_computed(int32_t seq, std::span<const int32_t> tokens, int32_t num_computed) {
  if (!radix_) return;
  Sequence& s = sequence(seq);
  const int32_t num_full_blocks = num_computed / layout().page_size;
  if (num_full_blocks <= s.num_cached_blocks) return;
  auto inserted = radix_->insert(tokens.first(static_cast<size_t>(num_full_blocks) * layout().page_size),
                                 s.table.view());
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

AttentionView PagedCacheManager::build_view(int layer, const ForwardBatch& batch) {
  const KvLayout& l = layout();
  q_indptr_.assign(1, 0);
  seq_views_.clear();
  for (const SequenceSlice& slice : batch.sequences) {
    const PageTableView t = sequence(slice.seq_slot).table.view();
    q_indptr_.push_back(q_indptr_.back() + slice.num_tokens);
    seq_views_.push_back(SeqKvView{t.pages(layer, 0), t.stride, t.num_tokens + t.stream(layer, 0)});
  }
  AttentionView view;
  view.kv_base = pool_.storage()->base();
  view.kv_dtype = l.dtype;
  view.page_bytes = l.page_bytes();
  view.page_size = l.page_size;
  view.head_dim = l.head_dim;
  view.num_kv_heads = l.num_kv_heads;
  view.num_seqs = static_cast<int32_t>(batch.sequences.size());
  view.q_indptr = q_indptr_.data();
  view.seqs = seq_views_.data();
  return view;
}

void PagedCacheManager::attend(int layer, const LayerConfig&, const ForwardBatch& batch, TensorView q, TensorView k,
                               TensorView v, TensorView out, const AttentionParams& params) {
  const AttentionView view = build_view(layer, batch);
  write_kv(view, k, v);
  paged_attention(out, q, view, params);
}

Status PagedCacheManager::check_integrity() const {
  SE_RETURN_IF_ERROR(pool_.check_integrity());
  if (radix_) SE_RETURN_IF_ERROR(radix_->check_integrity());
  for (const auto& [seq, s] : sequences_) SE_RETURN_IF_ERROR(s.table.check_integrity().with_context(fmt::format("sequence {}", seq)));
  return Status::ok();
}

}  // namespace se
