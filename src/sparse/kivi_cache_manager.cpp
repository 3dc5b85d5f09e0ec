#include "sparse/kivi_cache_manager.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "backend/quant/kivi_quant.h"
#include "base/check.h"
#include "kv/page_storage.h"

namespace se {

namespace {

// A fresh table epoch: one counter for every KIVI sequence of the process, so epochs never repeat.
uint64_t next_epoch() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

class KiviCacheManager::Snapshot final : public SequenceSnapshot {
 public:
  Snapshot(BlockPool* pool, Sequence state) : pool(pool), state(std::move(state)) {}
  ~Snapshot() override { release_pages(*pool, state); }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  int32_t num_logical_tokens() const override { return static_cast<int32_t>(state.window.length()); }
  int64_t num_held_pages() const override {
    int64_t total = 0;
    for (size_t i = 0; i < state.quantized.size(); ++i)
      total += static_cast<int64_t>(state.quantized[i].size() + state.residual[i].size());
    return total;
  }
  BlockPool* pool;
  Sequence state;  // emptied of its pages when restored
};

Result<std::unique_ptr<KiviCacheManager>> KiviCacheManager::create(const KvLayout& layout, int32_t num_pages,
                                                                   Allocator* allocator) {
  SE_RETURN_IF_ERROR(layout.validate());
  if (!layout.kivi()) return invalid_argument("kivi cache: the layout's store is {}", kv_store_kind_name(layout.store));
  if (allocator == nullptr || allocator->device() != Device::kCpu || layout.dtype != DType::kF32)
    return unimplemented("the {} KV store runs on the CPU only (f32 residual rows), got {} rows",
                         kv_store_kind_name(layout.store), dtype_name(layout.dtype));
  SE_ASSIGN_OR_RETURN(std::unique_ptr<ArenaPageStorage> storage,
                      ArenaPageStorage::create(allocator, num_pages, layout.page_bytes()));
  return std::unique_ptr<KiviCacheManager>(new KiviCacheManager(layout, std::move(storage)));
}

KiviCacheManager::KiviCacheManager(const KvLayout& layout, std::unique_ptr<PageStorage> storage)
    : CacheManager(layout),
      pool_(std::move(storage)),
      page_layout_(
          kivi_page_layout(layout.page_size, layout.kivi_value_group_size, layout.head_dim, kivi_bits(layout.store))),
      residual_page_tokens_(layout.residual_page_tokens()) {}

KiviCacheManager::Sequence& KiviCacheManager::sequence(int32_t seq) {
  auto it = sequences_.find(seq);
  SE_CHECK(it != sequences_.end(), "sequence {} is not open", seq);
  return it->second;
}

const KiviCacheManager::Sequence& KiviCacheManager::sequence(int32_t seq) const {
  auto it = sequences_.find(seq);
  SE_CHECK(it != sequences_.end(), "sequence {} is not open", seq);
  return it->second;
}

KiviCacheManager::Sequence KiviCacheManager::new_sequence() const {
  const auto num_streams = static_cast<size_t>(layout().num_streams());
  return Sequence{KiviResidualWindow(layout().kivi_residual),
                  0,
                  0,
                  0,
                  std::vector<std::vector<int32_t>>(num_streams),
                  std::vector<std::vector<int32_t>>(num_streams),
                  {},
                  next_epoch()};
}

KiviCacheManager::StepPages KiviCacheManager::step_pages(const Sequence& s, int32_t num_new_tokens) const {
  // The window once the pending flush has run: its first slot moves past the values that flush quantizes, and
  // the pages it leaves go back.
  const int64_t first = s.first_slot + (s.window.quantized_values() - s.stored_values);
  const int64_t kept_residual = static_cast<int64_t>(s.residual.front().size()) - first / residual_page_tokens_;
  KiviResidualWindow after = s.window;
  after.append(num_new_tokens);
  StepPages pages;
  // During the step the window holds every token from its first quantized-later value to the new end.
  const int64_t held = s.window.length() + num_new_tokens - s.window.quantized_values();
  pages.residual = std::max<int64_t>(
      0, ceil_div(first % residual_page_tokens_ + held, residual_page_tokens_) - std::max<int64_t>(kept_residual, 0));
  pages.quantized = after.quantized_keys() / layout().page_size - static_cast<int64_t>(s.quantized.front().size());
  return pages;
}

int64_t KiviCacheManager::pages_to_reserve(int32_t seq, int32_t num_new_tokens) const {
  const StepPages pages = step_pages(sequence(seq), num_new_tokens);
  return layout().num_streams() * (pages.residual + pages.quantized);
}

int64_t KiviCacheManager::num_held_pages(int32_t seq) const {
  const Sequence& s = sequence(seq);
  int64_t total = 0;
  for (size_t i = 0; i < s.quantized.size(); ++i)
    total += static_cast<int64_t>(s.quantized[i].size() + s.residual[i].size());
  return total;
}

int32_t KiviCacheManager::num_logical_tokens(int32_t seq) const {
  return static_cast<int32_t>(sequence(seq).window.length());
}

std::span<const int32_t> KiviCacheManager::slot_positions(int32_t seq, int layer, int kv_head) const {
  SE_CHECK(layer >= 0 && layer < layout().num_layers && kv_head >= 0 && kv_head < layout().num_kv_heads,
           "kivi cache: no stream (layer {}, head {})", layer, kv_head);
  return sequence(seq).positions;
}

Result<int32_t> KiviCacheManager::open(int32_t seq, std::span<const int32_t> /*prompt*/) {
  if (sequences_.count(seq) != 0) return failed_precondition("sequence {} is already open", seq);
  sequences_.emplace(seq, new_sequence());
  return 0;  // no prefix cache over KIVI pages
}

Status KiviCacheManager::reserve(int32_t seq, int32_t num_new_tokens) {
  if (num_new_tokens < 0) return invalid_argument("kivi cache: cannot reserve {} tokens", num_new_tokens);
  Sequence& s = sequence(seq);
  if (s.window.length() + num_new_tokens > INT32_MAX)
    return out_of_range("kivi cache: {} + {} tokens overflow int32", s.window.length(), num_new_tokens);
  // A step whose forward ran but was not reported yet flushes first (its rows are in the window).
  flush(s);
  const StepPages pages = step_pages(s, num_new_tokens);
  const int64_t per_stream = pages.residual + pages.quantized;
  const int64_t needed = layout().num_streams() * per_stream;
  if (needed > INT32_MAX) return resource_exhausted("kivi cache: {} tokens need {} pages", num_new_tokens, needed);
  SE_ASSIGN_OR_RETURN(std::vector<int32_t> taken, pool_.allocate(static_cast<int32_t>(needed)));
  size_t next = 0;
  for (size_t i = 0; i < s.quantized.size(); ++i) {
    for (int64_t p = 0; p < pages.residual; ++p) s.residual[i].push_back(taken[next++]);
    for (int64_t p = 0; p < pages.quantized; ++p) s.quantized[i].push_back(taken[next++]);
  }
  s.window.append(num_new_tokens);
  for (auto p = static_cast<int32_t>(s.positions.size()); p < s.window.length(); ++p) s.positions.push_back(p);
  return Status::ok();
}

void KiviCacheManager::flush(Sequence& s) {
  const int32_t keys_end = static_cast<int32_t>(s.window.quantized_keys());
  const int32_t values_end = static_cast<int32_t>(s.window.quantized_values());
  if (keys_end == s.stored_keys && values_end == s.stored_values) return;
  const KvLayout& l = layout();
  const int32_t group = l.page_size, dim = l.head_dim, bits = kivi_bits(l.store), per_page = residual_page_tokens_;
  char* base = static_cast<char*>(pool_.storage()->base());
  const size_t page_bytes = l.page_bytes();
  auto page = [&](int32_t id) { return base + static_cast<size_t>(id) * page_bytes; };
  rows_.resize(static_cast<size_t>(group) * static_cast<size_t>(dim));
  for (size_t i = 0; i < s.quantized.size(); ++i) {
    const std::vector<int32_t>& residual = s.residual[i];
    // Row kv (0 = K, 1 = V) of token j, still in the window.
    auto row = [&](int kv, int32_t j) {
      const int32_t slot = j - s.stored_values + s.first_slot;
      return reinterpret_cast<const float*>(page(residual[static_cast<size_t>(slot / per_page)])) +
             (static_cast<size_t>(kv) * static_cast<size_t>(per_page) + static_cast<size_t>(slot % per_page)) *
                 static_cast<size_t>(dim);
    };
    // Keys: whole groups, one row per channel over the group's tokens.
    for (int32_t first = s.stored_keys; first < keys_end; first += group) {
      for (int32_t t = 0; t < group; ++t)
        std::memcpy(&rows_[static_cast<size_t>(t) * static_cast<size_t>(dim)], row(0, first + t),
                    static_cast<size_t>(dim) * sizeof(float));
      char* target = page(s.quantized[i][static_cast<size_t>(first / group)]);
      auto* words = reinterpret_cast<uint32_t*>(target + page_layout_.key_codes);
      auto* scale = reinterpret_cast<uint16_t*>(target + page_layout_.key_scale);
      auto* mn = reinterpret_cast<uint16_t*>(target + page_layout_.key_min);
      for (int32_t c = 0; c < dim; ++c)
        kivi_quantize_row(&rows_[static_cast<size_t>(c)], group, dim, group, bits,
                          words + static_cast<int64_t>(c) * page_layout_.key_words, &scale[c], &mn[c]);
    }
    // Values: one token at a time, into its slot of its group's page.
    for (int32_t j = s.stored_values; j < values_end; ++j) {
      char* target = page(s.quantized[i][static_cast<size_t>(j / group)]);
      const int32_t t = j % group;
      kivi_quantize_row(row(1, j), dim, 1, l.kivi_value_group_size, bits,
                        reinterpret_cast<uint32_t*>(target + page_layout_.value_codes) +
                            static_cast<int64_t>(t) * page_layout_.value_words,
                        reinterpret_cast<uint16_t*>(target + page_layout_.value_scale) +
                            static_cast<int64_t>(t) * page_layout_.value_groups,
                        reinterpret_cast<uint16_t*>(target + page_layout_.value_min) +
                            static_cast<int64_t>(t) * page_layout_.value_groups);
    }
  }
  // The window slides past the quantized values: whole pages it left go back.
  const int32_t first = s.first_slot + (values_end - s.stored_values);
  const int32_t dropped = first / per_page;
  if (dropped > 0) {
    for (std::vector<int32_t>& residual : s.residual) {
      pool_.release(std::span<const int32_t>(residual.data(), static_cast<size_t>(dropped)));
      residual.erase(residual.begin(), residual.begin() + dropped);
    }
    s.epoch = next_epoch();  // listed pages moved
  }
  s.first_slot = first % per_page;
  s.stored_keys = keys_end;
  s.stored_values = values_end;
}

void KiviCacheManager::on_computed(int32_t seq, std::span<const int32_t> /*tokens*/, int32_t /*num_computed*/) {
  flush(sequence(seq));
}

void KiviCacheManager::release_pages(BlockPool& pool, Sequence& s) {
  for (size_t i = 0; i < s.quantized.size(); ++i) {
    pool.release(s.quantized[i]);
    pool.release(s.residual[i]);
    s.quantized[i].clear();
    s.residual[i].clear();
  }
}

void KiviCacheManager::close(int32_t seq) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) return;
  release_pages(pool_, it->second);
  sequences_.erase(it);
}

std::unique_ptr<SequenceSnapshot> KiviCacheManager::snapshot(int32_t seq) {
  auto it = sequences_.find(seq);
  SE_CHECK(it != sequences_.end(), "sequence {} is not open", seq);
  flush(it->second);
  auto snap = std::make_unique<Snapshot>(&pool_, std::move(it->second));
  sequences_.erase(it);
  return snap;
}

Status KiviCacheManager::restore(int32_t seq, std::unique_ptr<SequenceSnapshot> snapshot) {
  if (sequences_.count(seq) != 0) return failed_precondition("sequence {} is already open", seq);
  auto* kivi = dynamic_cast<Snapshot*>(snapshot.get());
  if (kivi == nullptr || kivi->pool != &pool_)
    return invalid_argument("restore: the snapshot was not taken by this KIVI cache");
  Sequence& s = sequences_.emplace(seq, new_sequence()).first->second;
  std::swap(s, kivi->state);  // the snapshot keeps an empty sequence, so its destructor releases nothing
  s.epoch = next_epoch();
  return Status::ok();
}

AttentionView KiviCacheManager::make_view(int layer, const std::vector<const Sequence*>& sequences) {
  const KvLayout& l = layout();
  const auto heads = static_cast<size_t>(l.num_kv_heads);
  // Per sequence: quantized lists [heads][stride_q], residual lists [heads][stride_r], then five [heads] counts.
  size_t total = 0;
  for (const Sequence* s : sequences) {
    const size_t stream = static_cast<size_t>(l.stream(layer, 0));
    total += heads * (s->quantized[stream].size() + s->residual[stream].size() + 5);
  }
  tables_.assign(total, 0);
  seq_views_.clear();
  kivi_views_.clear();
  int32_t* at = tables_.data();
  for (const Sequence* s : sequences) {
    const size_t stream = static_cast<size_t>(l.stream(layer, 0));
    const auto stride_q = static_cast<int32_t>(s->quantized[stream].size());
    const auto stride_r = static_cast<int32_t>(s->residual[stream].size());
    int32_t* quantized = at;
    int32_t* residual = quantized + heads * static_cast<size_t>(stride_q);
    int32_t* counts = residual + heads * static_cast<size_t>(stride_r);
    int32_t* num_tokens = counts;
    int32_t* keys = counts + heads;
    int32_t* values = keys + heads;
    int32_t* residual_tokens = values + heads;
    int32_t* first_slot = residual_tokens + heads;
    at = first_slot + heads;
    for (size_t h = 0; h < heads; ++h) {
      std::copy(s->quantized[stream + h].begin(), s->quantized[stream + h].end(), quantized + h * stride_q);
      std::copy(s->residual[stream + h].begin(), s->residual[stream + h].end(), residual + h * stride_r);
      num_tokens[h] = static_cast<int32_t>(s->window.length());
      keys[h] = s->stored_keys;
      values[h] = s->stored_values;
      residual_tokens[h] = num_tokens[h] - s->stored_values;
      first_slot[h] = s->first_slot;
    }
    seq_views_.push_back(SeqKvView{quantized, stride_q, num_tokens});
    kivi_views_.push_back(KiviSeqView{keys, values, SeqKvView{residual, stride_r, residual_tokens}, first_slot});
  }
  AttentionView view;
  view.kv_base = pool_.storage()->base();
  view.kv_device = pool_.storage()->device();
  view.kv_dtype = l.dtype;
  view.page_bytes = l.page_bytes();
  view.page_size = residual_page_tokens_;  // the residual pages' explicit rows
  view.head_dim = l.head_dim;
  view.num_kv_heads = l.num_kv_heads;
  view.num_seqs = static_cast<int32_t>(sequences.size());
  view.q_indptr = q_indptr_.data();
  view.seqs = seq_views_.data();
  view.payload = KvPayload::kQuantized;
  view.quantized.scheme = KvQuantScheme::kKivi;
  view.quantized.quantized_base = pool_.storage()->base();
  view.quantized.quantized_page_bytes = l.page_bytes();
  view.quantized.bits = kivi_bits(l.store);
  view.quantized.group_size = l.page_size;
  view.quantized.value_group_size = l.kivi_value_group_size;
  view.quantized.kivi_seqs = kivi_views_.data();
  return view;
}

AttentionView KiviCacheManager::build_view(int layer, const ForwardBatch& batch) {
  q_indptr_.assign(1, 0);
  view_sequences_.clear();
  for (const SequenceSlice& slice : batch.sequences) {
    q_indptr_.push_back(q_indptr_.back() + slice.num_tokens);
    view_sequences_.push_back(&sequence(slice.seq));
  }
  return make_view(layer, view_sequences_);
}

AttentionView KiviCacheManager::build_sequence_view(int32_t seq, int layer) {
  q_indptr_.assign(2, 0);
  view_sequences_.assign(1, &sequence(seq));
  return make_view(layer, view_sequences_);
}

void KiviCacheManager::write(int /*layer*/, const AttentionView& view, TensorView k, TensorView v) {
  const int32_t dim = view.head_dim, heads = view.num_kv_heads, per_page = view.page_size;
  SE_CHECK(k.device == Device::kCpu && v.device == Device::kCpu && k.dtype == DType::kF32 && v.dtype == DType::kF32,
           "kivi cache: writes f32 rows on the CPU");
  SE_CHECK(k.numel() == int64_t{view.q_indptr[view.num_seqs]} * heads * dim && v.numel() == k.numel(),
           "kivi cache: k {} and v {} for {} rows of {} KV heads x {}", k.shape.to_string(), v.shape.to_string(),
           view.q_indptr[view.num_seqs], heads, dim);
  const auto* k_rows = k.ptr<const float>();
  const auto* v_rows = v.ptr<const float>();
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    const KiviSeqView& kivi = view.quantized.kivi_seqs[s];
    const int32_t n = view.q_indptr[s + 1] - view.q_indptr[s];
    for (int32_t h = 0; h < heads; ++h) {
      const int32_t len = view.seqs[s].num_tokens[h];
      const int32_t* pages = kivi.residual.page_ids + static_cast<int64_t>(h) * kivi.residual.stride;
      for (int32_t r = 0; r < n; ++r) {
        // The sequence's new tokens are the last n of the stream, all in the window.
        const int32_t slot = len - n + r - kivi.num_quantized_values[h] + kivi.residual_first_slot[h];
        const size_t source = (static_cast<size_t>(view.q_indptr[s] + r) * heads + static_cast<size_t>(h)) * dim;
        std::memcpy(view.element<float>(pages[slot / per_page], 0, slot % per_page), k_rows + source,
                    static_cast<size_t>(dim) * sizeof(float));
        std::memcpy(view.element<float>(pages[slot / per_page], 1, slot % per_page), v_rows + source,
                    static_cast<size_t>(dim) * sizeof(float));
      }
    }
  }
}

Status KiviCacheManager::evict_streams(int32_t seq, std::span<const StreamEviction> streams) {
  return unimplemented(
      "evict: the {} KV store cannot drop tokens of sequence {} ({} streams): eviction over KIVI "
      "groups is not implemented",
      kv_store_kind_name(layout().store), seq, streams.size());
}

Status KiviCacheManager::evict_slots(int32_t seq, std::span<const SlotEviction> streams) {
  return unimplemented(
      "evict: the {} KV store cannot drop tokens of sequence {} ({} streams): eviction over KIVI "
      "groups is not implemented",
      kv_store_kind_name(layout().store), seq, streams.size());
}

Status KiviCacheManager::check_integrity() const {
  SE_RETURN_IF_ERROR(pool_.check_integrity());
  const KvLayout& l = layout();
  std::vector<int32_t> all;
  for (const auto& [seq, s] : sequences_) {
    const int64_t len = s.window.length();
    if (!(0 <= s.stored_values && s.stored_values <= s.stored_keys && s.stored_keys <= len &&
          s.stored_keys % l.page_size == 0 && s.stored_keys <= s.window.quantized_keys() &&
          s.stored_values <= s.window.quantized_values() && 0 <= s.first_slot && s.first_slot < residual_page_tokens_))
      return internal_error(
          "kivi sequence {}: {} tokens, {} keys and {} values quantized (window: {}, {}), first "
          "slot {}",
          seq, len, s.stored_keys, s.stored_values, s.window.quantized_keys(), s.window.quantized_values(),
          s.first_slot);
    if (static_cast<int64_t>(s.positions.size()) != len)
      return internal_error("kivi sequence {}: {} positions for {} tokens", seq, s.positions.size(), len);
    const int64_t residual_pages = ceil_div(s.first_slot + len - s.stored_values, residual_page_tokens_);
    for (size_t i = 0; i < s.quantized.size(); ++i) {
      if (static_cast<int64_t>(s.quantized[i].size()) != s.window.quantized_keys() / l.page_size ||
          static_cast<int64_t>(s.residual[i].size()) != residual_pages)
        return internal_error("kivi sequence {} stream {}: {} quantized and {} residual pages, want {} and {}", seq, i,
                              s.quantized[i].size(), s.residual[i].size(), s.window.quantized_keys() / l.page_size,
                              residual_pages);
      for (const std::vector<int32_t>* list : {&s.quantized[i], &s.residual[i]})
        for (int32_t page : *list) {
          if (!pool_.is_valid_id(page) || pool_.ref_count(page) != 1)
            return internal_error("kivi sequence {} stream {}: page {} is not held by it alone", seq, i, page);
          all.push_back(page);
        }
    }
  }
  std::sort(all.begin(), all.end());
  if (const auto dup = std::adjacent_find(all.begin(), all.end()); dup != all.end())
    return internal_error("kivi cache: page {} listed twice", *dup);
  return Status::ok();
}

}  // namespace se
