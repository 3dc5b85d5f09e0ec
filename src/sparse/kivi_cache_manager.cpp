#include "sparse/kivi_cache_manager.h"

#include <algorithm>
#include <atomic>

#include "backend/device_memory.h"
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
  Snapshot(const KvLayout& layout, BlockPool* pool, Sequence state)
      : layout(layout), pool(pool), state(std::move(state)) {}
  ~Snapshot() override { release_pages(*pool, state); }
  Snapshot(const Snapshot&) = delete;
  Snapshot& operator=(const Snapshot&) = delete;
  int32_t num_logical_tokens() const override { return state.num_logical; }
  int64_t num_held_pages() const override { return pages_of(state); }
  // No host tier for KIVI pages: it is never offloaded.
  int64_t num_host_pages_short() const override { return 0; }
  // Each stream at its fullest on the way to its length plus the new tokens, less what it holds: the key groups it
  // has once they have flushed (counted from its own window, which dropped groups leave off the layout's whole
  // R-blocks) and a window at its fullest (whatever it held when it was taken).
  std::optional<int64_t> num_pages_to_extend(int64_t num_new_tokens) const override {
    int64_t most = 0;
    for (const Stream& stream : state.streams) {
      KiviResidualWindow grown = stream.window;
      grown.append(num_new_tokens);
      most += grown.quantized_keys() / layout.page_size + window_pages(layout, stream.window.length() + num_new_tokens);
    }
    return std::max<int64_t>(0, most - pages_of(state));
  }
  const KvLayout& layout;
  BlockPool* pool;
  Sequence state;  // emptied of its pages when restored
};

Result<std::unique_ptr<KiviCacheManager>> KiviCacheManager::create(const KvLayout& layout, int32_t num_pages,
                                                                   Allocator* allocator, bool hold_prompts) {
  SE_RETURN_IF_ERROR(layout.validate());
  if (!layout.kivi()) return invalid_argument("kivi cache: the layout's store is {}", kv_store_kind_name(layout.store));
  if (allocator == nullptr) return invalid_argument("kivi cache: no allocator");
  const DType rows = kv_page_dtype(allocator->device(), layout.store);
  if (layout.dtype != rows)
    return invalid_argument("the {} KV store keeps {} residual rows on {}, got {}", kv_store_kind_name(layout.store),
                            dtype_name(rows), device_name(allocator->device()), dtype_name(layout.dtype));
  SE_ASSIGN_OR_RETURN(std::unique_ptr<ArenaPageStorage> storage,
                      ArenaPageStorage::create(allocator, num_pages, layout.page_bytes()));
  return std::unique_ptr<KiviCacheManager>(new KiviCacheManager(layout, std::move(storage), hold_prompts));
}

KiviCacheManager::KiviCacheManager(const KvLayout& layout, std::unique_ptr<PageStorage> storage, bool hold_prompts)
    : CacheManager(layout),
      pool_(std::move(storage)),
      page_layout_(
          kivi_page_layout(layout.page_size, layout.kivi_value_group_size, layout.head_dim, kivi_bits(layout.store))),
      residual_page_tokens_(layout.residual_page_tokens()),
      hold_prompts_(hold_prompts) {}

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

KiviCacheManager::Sequence KiviCacheManager::new_sequence(int32_t held_prompt) const {
  Sequence s;
  s.streams.assign(static_cast<size_t>(layout().num_streams()), Stream{KiviResidualWindow(layout().kivi_residual)});
  s.held_prompt = held_prompt;
  s.epoch = next_epoch();
  return s;
}

int64_t KiviCacheManager::planned_key_groups(const KiviResidualWindow& window) const {
  KiviResidualWindow flushed = window;
  flushed.append(0);  // what held tokens quantize once released (nothing for a window that is not held)
  return flushed.quantized_keys() / layout().page_size;
}

KiviCacheManager::StepPages KiviCacheManager::step_pages(const Stream& stream, int32_t num_new_tokens) const {
  // The window once the pending flush has run: its first slot moves past the values that flush quantizes, and
  // the pages it leaves go back.
  const int64_t first = stream.first_slot + (stream.window.quantized_values() - stream.stored_values);
  const int64_t kept_residual = static_cast<int64_t>(stream.residual.size()) - first / residual_page_tokens_;
  // During the step the window holds every token from its first quantized-later value to the new end.
  const int64_t held = stream.window.length() + num_new_tokens - stream.window.quantized_values();
  KiviResidualWindow after = stream.window;
  after.hold(num_new_tokens);  // the groups a held prompt fills once released are taken as it grows
  StepPages pages;
  pages.residual = std::max<int64_t>(
      0, ceil_div(first % residual_page_tokens_ + held, residual_page_tokens_) - std::max<int64_t>(kept_residual, 0));
  pages.quantized = planned_key_groups(after) - static_cast<int64_t>(stream.quantized.size());
  return pages;
}

int64_t KiviCacheManager::held_prompt_pages(const KvLayout& layout, int64_t num_tokens) {
  const int64_t rows = ceil_div(num_tokens, layout.residual_page_tokens());
  const int64_t key_groups = num_tokens / layout.kivi_residual * layout.kivi_residual / layout.page_size;
  return layout.num_streams() * (rows + key_groups);
}

int64_t KiviCacheManager::window_pages(const KvLayout& layout, int64_t num_tokens) {
  return layout.pages_per_stream(num_tokens) -
         num_tokens / layout.kivi_residual * layout.kivi_residual / layout.page_size;
}

int64_t KiviCacheManager::sealed_group_eviction_pages(const KvLayout& layout, int64_t num_tokens, int64_t max_kept) {
  // However many groups went, the keys of every R-block appended are all a stream ever quantized, and one that
  // held max_kept tokens after the last step holds max_kept + 1 during a one-token step.
  const int64_t group = layout.page_size;
  const int64_t quantized_keys = std::min(num_tokens / layout.kivi_residual * layout.kivi_residual,
                                          std::min(num_tokens, max_kept + 1) / group * group);
  return layout.num_streams() * (quantized_keys / group + window_pages(layout, num_tokens));
}

int64_t KiviCacheManager::pages_to_reserve(int32_t seq, int32_t num_new_tokens) const {
  int64_t total = 0;
  for (const Stream& stream : sequence(seq).streams) {
    const StepPages pages = step_pages(stream, num_new_tokens);
    total += pages.residual + pages.quantized;
  }
  return total;
}

int64_t KiviCacheManager::pages_of(const Sequence& s) {
  int64_t total = 0;
  for (const Stream& stream : s.streams)
    total += static_cast<int64_t>(stream.quantized.size() + stream.residual.size());
  return total;
}

int64_t KiviCacheManager::num_held_pages(int32_t seq) const { return pages_of(sequence(seq)); }

int32_t KiviCacheManager::num_logical_tokens(int32_t seq) const { return sequence(seq).num_logical; }

std::span<const int32_t> KiviCacheManager::slot_positions(int32_t seq, int layer, int kv_head) const {
  SE_CHECK(layer >= 0 && layer < layout().num_layers && kv_head >= 0 && kv_head < layout().num_kv_heads,
           "kivi cache: no stream (layer {}, head {})", layer, kv_head);
  return sequence(seq).streams[static_cast<size_t>(layout().stream(layer, kv_head))].positions;
}

Result<int32_t> KiviCacheManager::open(int32_t seq, std::span<const int32_t> prompt) {
  if (sequences_.count(seq) != 0) return failed_precondition("sequence {} is already open", seq);
  sequences_.emplace(seq, new_sequence(hold_prompts_ ? static_cast<int32_t>(prompt.size()) : 0));
  return 0;  // no prefix cache over KIVI pages
}

Status KiviCacheManager::reserve(int32_t seq, int32_t num_new_tokens) {
  if (num_new_tokens < 0) return invalid_argument("kivi cache: cannot reserve {} tokens", num_new_tokens);
  Sequence& s = sequence(seq);
  if (int64_t{s.num_logical} + num_new_tokens > INT32_MAX)
    return out_of_range("kivi cache: {} + {} tokens overflow int32", s.num_logical, num_new_tokens);
  // A step whose forward ran but was not reported yet flushes first (its rows are in the window).
  flush(s);
  std::vector<StepPages> pages(s.streams.size());
  int64_t needed = 0;
  for (size_t i = 0; i < s.streams.size(); ++i) {
    pages[i] = step_pages(s.streams[i], num_new_tokens);
    needed += pages[i].residual + pages[i].quantized;
  }
  if (needed > INT32_MAX) return resource_exhausted("kivi cache: {} tokens need {} pages", num_new_tokens, needed);
  SE_ASSIGN_OR_RETURN(std::vector<int32_t> taken, pool_.allocate(static_cast<int32_t>(needed)));
  size_t next = 0;
  for (size_t i = 0; i < s.streams.size(); ++i) {
    Stream& stream = s.streams[i];
    for (int64_t p = 0; p < pages[i].residual; ++p) stream.residual.push_back(taken[next++]);
    for (int64_t p = 0; p < pages[i].quantized; ++p) stream.quantized.push_back(taken[next++]);
    if (s.held_prompt > 0) {
      stream.window.hold(num_new_tokens);
    } else {
      stream.window.append(num_new_tokens);
    }
    for (int32_t p = s.num_logical; p < s.num_logical + num_new_tokens; ++p) stream.positions.push_back(p);
  }
  s.num_logical += num_new_tokens;
  return Status::ok();
}

void KiviCacheManager::flush(Sequence& s) {
  if (s.held_prompt > 0) return;
  flush_rows_.clear();
  for (Stream& stream : s.streams) flush(stream);
  quantize_kivi_rows(pool_view(), flush_rows_.rows());
}

void KiviCacheManager::flush(Stream& stream) {
  const int32_t keys_end = static_cast<int32_t>(stream.window.quantized_keys());
  const int32_t values_end = static_cast<int32_t>(stream.window.quantized_values());
  if (keys_end == stream.stored_keys && values_end == stream.stored_values) return;
  const int32_t group = layout().page_size, per_page = residual_page_tokens_;
  // Window row of token j (page * per_page + slot), still in the window.
  auto row = [&](int32_t j) {
    const int32_t slot = j - stream.stored_values + stream.first_slot;
    return int64_t{stream.residual[static_cast<size_t>(slot / per_page)]} * per_page + slot % per_page;
  };
  // Keys: whole groups; values: one token at a time, into its slot of its group's page.
  for (int32_t first = stream.stored_keys; first < keys_end; first += group) {
    flush_rows_.key_pages.push_back(stream.quantized[static_cast<size_t>(first / group)]);
    for (int32_t t = 0; t < group; ++t) flush_rows_.key_rows.push_back(row(first + t));
  }
  for (int32_t j = stream.stored_values; j < values_end; ++j) {
    flush_rows_.value_pages.push_back(stream.quantized[static_cast<size_t>(j / group)]);
    flush_rows_.value_slots.push_back(j % group);
    flush_rows_.value_rows.push_back(row(j));
  }
  // The window slides past the quantized values: whole pages it left go back (the quantization, enqueued after this
  // step's writes, reads them before a later step can take them).
  const int32_t first = stream.first_slot + (values_end - stream.stored_values);
  const int32_t dropped = first / per_page;
  if (dropped > 0) {
    pool_.release(std::span<const int32_t>(stream.residual.data(), static_cast<size_t>(dropped)));
    stream.residual.erase(stream.residual.begin(), stream.residual.begin() + dropped);
  }
  stream.first_slot = first % per_page;
  stream.stored_keys = keys_end;
  stream.stored_values = values_end;
}

void KiviCacheManager::on_computed(int32_t seq, std::span<const int32_t> /*tokens*/, int32_t /*num_computed*/) {
  Sequence& s = sequence(seq);
  if (s.held_prompt > 0 && s.num_logical >= s.held_prompt) {
    // The prompt is in (and the method, which evicts in the step's finish_step, has compressed it): what is left of
    // it flushes as a one-shot prefill of the kept tokens would.
    s.held_prompt = 0;
    for (Stream& stream : s.streams) stream.window.append(0);
  }
  flush(s);
}

void KiviCacheManager::release_pages(BlockPool& pool, Sequence& s) {
  for (Stream& stream : s.streams) {
    pool.release(stream.quantized);
    pool.release(stream.residual);
    stream.quantized.clear();
    stream.residual.clear();
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
  auto snap = std::make_unique<Snapshot>(layout(), &pool_, std::move(it->second));
  sequences_.erase(it);
  return snap;
}

Status KiviCacheManager::restore(int32_t seq, std::unique_ptr<SequenceSnapshot> snapshot) {
  if (sequences_.count(seq) != 0) return failed_precondition("sequence {} is already open", seq);
  auto* kivi = dynamic_cast<Snapshot*>(snapshot.get());
  if (kivi == nullptr || kivi->pool != &pool_)
    return invalid_argument("restore: the snapshot was not taken by this KIVI cache");
  Sequence& s = sequences_.emplace(seq, new_sequence(0)).first->second;
  std::swap(s, kivi->state);  // the snapshot keeps an empty sequence, so its destructor releases nothing
  s.epoch = next_epoch();
  return Status::ok();
}

const KiviCacheManager::GroupTable& KiviCacheManager::group_table(const Sequence& s, int layer) const {
  const KvLayout& l = layout();
  const auto heads = static_cast<size_t>(l.num_kv_heads);
  const auto first_stream = static_cast<size_t>(l.stream(layer, 0));
  if (s.group_tables.empty()) s.group_tables.resize(static_cast<size_t>(l.num_layers));
  GroupTable& t = s.group_tables[static_cast<size_t>(layer)];
  size_t longest = 0;
  bool shrank = false;  // never while the epoch holds; checked so that a table can only be whole or rebuilt
  for (size_t h = 0; h < heads; ++h) {
    const size_t size = s.streams[first_stream + h].quantized.size();
    longest = std::max(longest, size);
    shrank = shrank || (!t.listed.empty() && size < static_cast<size_t>(t.listed[h]));
  }
  if (static_cast<size_t>(t.capacity) < longest) {
    t.capacity = static_cast<int32_t>(longest + longest / 4 + 16);
    t.ids.assign(heads * static_cast<size_t>(t.capacity), 0);
    t.listed.clear();
  }
  if (t.epoch != s.epoch || shrank || t.listed.empty()) {
    t.listed.assign(heads, 0);
    t.epoch = s.epoch;
  }
  for (size_t h = 0; h < heads; ++h) {
    const std::vector<int32_t>& list = s.streams[first_stream + h].quantized;
    auto& listed = t.listed[h];
    std::copy(list.begin() + listed, list.end(), t.ids.begin() + static_cast<int64_t>(h) * t.capacity + listed);
    listed = static_cast<int32_t>(list.size());
  }
  return t;
}

AttentionView KiviCacheManager::make_view(int layer, const std::vector<const Sequence*>& sequences) {
  const KvLayout& l = layout();
  const auto heads = static_cast<size_t>(l.num_kv_heads);
  const auto first_stream = static_cast<size_t>(l.stream(layer, 0));
  // The longest window list of a sequence's streams of the layer: its residual table's stride.
  auto residual_stride = [&](const Sequence& s) {
    size_t residual = 0;
    for (size_t h = 0; h < heads; ++h) residual = std::max(residual, s.streams[first_stream + h].residual.size());
    return static_cast<int32_t>(residual);
  };
  // Per sequence: residual lists [heads][stride_r], then five [heads] counts.
  size_t total = 0;
  for (const Sequence* s : sequences) total += heads * (static_cast<size_t>(residual_stride(*s)) + 5);
  tables_.assign(total, 0);
  seq_views_.clear();
  kivi_views_.clear();
  int32_t* at = tables_.data();
  for (const Sequence* s : sequences) {
    const int32_t stride_r = residual_stride(*s);
    const GroupTable& groups = group_table(*s, layer);
    int32_t* residual = at;
    int32_t* counts = residual + heads * static_cast<size_t>(stride_r);
    int32_t* num_tokens = counts;
    int32_t* keys = counts + heads;
    int32_t* values = keys + heads;
    int32_t* residual_tokens = values + heads;
    int32_t* first_slot = residual_tokens + heads;
    at = first_slot + heads;
    for (size_t h = 0; h < heads; ++h) {
      const Stream& stream = s->streams[first_stream + h];
      std::copy(stream.residual.begin(), stream.residual.end(), residual + h * stride_r);
      num_tokens[h] = static_cast<int32_t>(stream.window.length());
      keys[h] = stream.stored_keys;
      values[h] = stream.stored_values;
      residual_tokens[h] = num_tokens[h] - stream.stored_values;
      first_slot[h] = stream.first_slot;
    }
    seq_views_.push_back(SeqKvView{groups.ids.data(), groups.capacity, num_tokens});
    kivi_views_.push_back(KiviSeqView{keys, values, SeqKvView{residual, stride_r, residual_tokens}, first_slot});
  }
  AttentionView view = pool_view();
  view.num_seqs = static_cast<int32_t>(sequences.size());
  view.q_indptr = q_indptr_.data();
  view.seqs = seq_views_.data();
  view.quantized.kivi_seqs = kivi_views_.data();
  return view;
}

AttentionView KiviCacheManager::pool_view() const {
  const KvLayout& l = layout();
  AttentionView view;
  view.kv_base = pool_.storage()->base();
  view.kv_device = pool_.storage()->device();
  view.kv_dtype = l.dtype;
  view.page_bytes = l.page_bytes();
  view.page_size = residual_page_tokens_;  // the residual pages' explicit rows
  view.head_dim = l.head_dim;
  view.num_kv_heads = l.num_kv_heads;
  view.payload = KvPayload::kQuantized;
  view.quantized.scheme = KvQuantScheme::kKivi;
  view.quantized.quantized_base = pool_.storage()->base();
  view.quantized.quantized_page_bytes = l.page_bytes();
  view.quantized.bits = kivi_bits(l.store);
  view.quantized.group_size = l.page_size;
  view.quantized.value_group_size = l.kivi_value_group_size;
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

Status KiviCacheManager::check_eviction(const Sequence& s, const StreamEviction& e) const {
  const KvLayout& l = layout();
  if (e.layer < 0 || e.layer >= l.num_layers || e.kv_head < 0 || e.kv_head >= l.num_kv_heads)
    return invalid_argument("evict: no stream (layer {}, head {})", e.layer, e.kv_head);
  const Stream& stream = s.streams[static_cast<size_t>(l.stream(e.layer, e.kv_head))];
  const int64_t len = stream.window.length();
  for (size_t i = 0; i < e.kept.size(); ++i)
    if (e.kept[i] < 0 || e.kept[i] >= len || (i > 0 && e.kept[i] <= e.kept[i - 1]))
      return invalid_argument("evict: kept indices must ascend within [0, {}), got {} at {}", len, e.kept[i], i);
  if (!has_quantized(stream)) return Status::ok();
  // A quantized key group mixes its tokens' channels, and a value still in the window is a row there: once the
  // stream has quantized tokens, only whole sealed groups may go.
  const int64_t group = l.page_size;
  const int64_t sealed = stream.window.quantized_values() / group * group;
  int64_t gap = 0;  // the first slot past the last kept one
  for (size_t i = 0; i <= e.kept.size(); ++i) {
    const int64_t kept = i < e.kept.size() ? e.kept[i] : len;
    if (kept > gap && (gap % group != 0 || kept % group != 0 || kept > sealed))
      return failed_precondition(
          "evict: the {} KV store quantized tokens of stream (layer {}, head {}) in groups of {}; it drops only whole "
          "groups whose keys and values are all quantized (slots [0, {})), not slots [{}, {})",
          kv_store_kind_name(l.store), e.layer, e.kv_head, group, sealed, gap, kept);
    gap = kept + 1;
  }
  return Status::ok();
}

bool KiviCacheManager::has_quantized(const Stream& stream) {
  return stream.window.quantized_keys() != 0 || stream.window.quantized_values() != 0;
}

bool KiviCacheManager::can_evict_streams(int32_t seq) const {
  const Sequence& s = sequence(seq);
  return std::none_of(s.streams.begin(), s.streams.end(), has_quantized);
}

KvStreams::SealedGroups KiviCacheManager::sealed_groups(int32_t seq, int layer, int kv_head) const {
  SE_CHECK(layer >= 0 && layer < layout().num_layers && kv_head >= 0 && kv_head < layout().num_kv_heads,
           "kivi cache: no stream (layer {}, head {})", layer, kv_head);
  const Stream& stream = sequence(seq).streams[static_cast<size_t>(layout().stream(layer, kv_head))];
  const int32_t group = layout().page_size;
  return {group, static_cast<int32_t>(stream.window.quantized_values() / group)};
}

void KiviCacheManager::drop_sealed_groups(Stream& stream, std::span<const int32_t> kept) {
  const int32_t group = layout().page_size;
  // A listed group stays when it holds a kept slot (check_eviction: all of them, or none and it goes).
  size_t next = 0, stays = 0;
  for (size_t g = 0; g < stream.quantized.size(); ++g) {
    const auto first = static_cast<int32_t>(g) * group;
    while (next < kept.size() && kept[next] < first) ++next;
    if (next < kept.size() && kept[next] < first + group) {
      stream.quantized[stays++] = stream.quantized[g];
    } else {
      pool_.release(std::span<const int32_t>(&stream.quantized[g], 1));
    }
  }
  stream.quantized.resize(stays);
  const int32_t dropped = static_cast<int32_t>(stream.positions.size() - kept.size());
  for (size_t i = 0; i < kept.size(); ++i) stream.positions[i] = stream.positions[static_cast<size_t>(kept[i])];
  stream.positions.resize(kept.size());
  // The window's counts move down by the dropped tokens; its rows and first slot stay where they are.
  stream.window.drop(dropped);
  stream.stored_keys -= dropped;
  stream.stored_values -= dropped;
}

Status KiviCacheManager::evict_streams(int32_t seq, std::span<const StreamEviction> streams) {
  Sequence& s = sequence(seq);
  if (streams.empty()) return Status::ok();  // nothing to drop: the step's flush stays where the step runs it
  const KvLayout& l = layout();
  // Per stream: 0 unlisted, else how it evicts (a stream with quantized tokens drops sealed groups, another
  // compacts its window).
  enum : uint8_t { kUnlisted, kCompacts, kDropsGroups };
  listed_.assign(static_cast<size_t>(l.num_streams()), kUnlisted);
  for (const StreamEviction& e : streams) {
    SE_RETURN_IF_ERROR(check_eviction(s, e));
    const size_t i = static_cast<size_t>(l.stream(e.layer, e.kv_head));
    if (listed_[i] != kUnlisted)
      return invalid_argument("evict: stream (layer {}, head {}) listed twice", e.layer, e.kv_head);
    listed_[i] = has_quantized(s.streams[i]) ? kDropsGroups : kCompacts;
  }
  // The step's pending flush first, so the groups it seals are quantized before their pages go.
  flush(s);
  // A stream nothing quantized starts its window at its first token, slot 0: kept rows move down in order.
  compactions_.clear();
  for (const StreamEviction& e : streams) {
    const size_t i = static_cast<size_t>(l.stream(e.layer, e.kv_head));
    Stream& stream = s.streams[i];
    if (listed_[i] == kDropsGroups) {
      drop_sealed_groups(stream, e.kept);
      continue;
    }
    SE_CHECK(stream.first_slot == 0, "kivi cache: an unquantized window starts at slot {}", stream.first_slot);
    compactions_.push_back(StreamCompaction{stream.residual.data(), e.kept});
  }
  if (!compactions_.empty()) {
    AttentionView window = pool_view();
    window.payload = KvPayload::kExplicit;
    compact_kv(window, compactions_);
  }
  const int32_t per_page = residual_page_tokens_;
  for (const StreamEviction& e : streams) {
    if (listed_[static_cast<size_t>(l.stream(e.layer, e.kv_head))] != kCompacts) continue;
    Stream& stream = s.streams[static_cast<size_t>(l.stream(e.layer, e.kv_head))];
    const auto kept = static_cast<int32_t>(e.kept.size());
    for (int32_t i = 0; i < kept; ++i)
      stream.positions[static_cast<size_t>(i)] = stream.positions[static_cast<size_t>(e.kept[static_cast<size_t>(i)])];
    stream.positions.resize(static_cast<size_t>(kept));
    stream.window = KiviResidualWindow(l.kivi_residual);
    if (s.held_prompt > 0) {
      stream.window.hold(kept);
    } else {
      stream.window.append(kept);
    }
    // Pages past what the kept tokens fill, and key groups their flush will not form, go back.
    const auto residual = static_cast<size_t>(ceil_div(stream.first_slot + kept, per_page));
    const auto quantized = static_cast<size_t>(planned_key_groups(stream.window));
    pool_.release(std::span<const int32_t>(stream.residual).subspan(residual));
    pool_.release(std::span<const int32_t>(stream.quantized).subspan(quantized));
    stream.residual.resize(residual);
    stream.quantized.resize(quantized);
  }
  s.epoch = next_epoch();
  flush(s);  // a window that is not held quantizes what the kept tokens fill
  return Status::ok();
}

Status KiviCacheManager::evict_slots(int32_t seq, std::span<const SlotEviction> streams) {
  return unimplemented(
      "evict: the {} KV store cannot drop single tokens of sequence {} ({} streams) as decode runs: its groups are "
      "quantized as they fill (only a held prompt is evicted, by evict_streams)",
      kv_store_kind_name(layout().store), seq, streams.size());
}

Status KiviCacheManager::check_integrity() const {
  SE_RETURN_IF_ERROR(pool_.check_integrity());
  const KvLayout& l = layout();
  std::vector<int32_t> all;
  for (const auto& [seq, s] : sequences_) {
    for (size_t i = 0; i < s.streams.size(); ++i) {
      const Stream& st = s.streams[i];
      const int64_t len = st.window.length();
      if (!(0 <= st.stored_values && st.stored_values <= st.stored_keys && st.stored_keys <= len &&
            len <= s.num_logical && st.stored_keys % l.page_size == 0 && st.stored_keys <= st.window.quantized_keys() &&
            st.stored_values <= st.window.quantized_values() && 0 <= st.first_slot &&
            st.first_slot < residual_page_tokens_ && (s.held_prompt == 0 || st.window.quantized_keys() == 0)))
        return internal_error(
            "kivi sequence {} stream {}: {} tokens of {}, {} keys and {} values quantized (window: {}, {}), first "
            "slot {}, {} prompt tokens held",
            seq, i, len, s.num_logical, st.stored_keys, st.stored_values, st.window.quantized_keys(),
            st.window.quantized_values(), st.first_slot, s.held_prompt);
      if (static_cast<int64_t>(st.positions.size()) != len)
        return internal_error("kivi sequence {} stream {}: {} positions for {} tokens", seq, i, st.positions.size(),
                              len);
      const int64_t residual_pages = ceil_div(st.first_slot + len - st.stored_values, residual_page_tokens_);
      const int64_t quantized_pages = planned_key_groups(st.window);
      if (static_cast<int64_t>(st.quantized.size()) != quantized_pages ||
          static_cast<int64_t>(st.residual.size()) != residual_pages)
        return internal_error("kivi sequence {} stream {}: {} quantized and {} residual pages, want {} and {}", seq, i,
                              st.quantized.size(), st.residual.size(), quantized_pages, residual_pages);
      for (const std::vector<int32_t>* list : {&st.quantized, &st.residual})
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
