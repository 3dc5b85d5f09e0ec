#include "sparse/attention_view_mirror.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/device_memory.h"
#include "backend/step_graph.h"
#include "base/check.h"

namespace se {

namespace {
size_t align8(size_t n) { return (n + 7) / 8 * 8; }
}  // namespace

bool AttentionViewMirror::place_regions(const KvLayout& l, const ForwardBatch& batch) {
  const size_t row_bytes = static_cast<size_t>(l.num_layers) * l.num_kv_heads * sizeof(int32_t);
  const auto room = [](int32_t longest) { return longest + longest / 4 + 16; };
  size_t needed = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const auto it = regions_.find(batch.sequences[s].seq);
    if (it == regions_.end() || it->second.capacity < longest_[s]) needed += row_bytes * room(longest_[s]);
  }
  if (needed == 0) return false;
  bool relaid = false;
  if (!lists_.defined() || lists_used_ + needed > lists_.nbytes()) {
    // Full: the regions of sequences that left go, and this batch's are laid out anew from the start, in a
    // buffer with as much room again for sequences that join later.
    regions_.clear();
    lists_used_ = 0;
    size_t total = 0;
    for (int32_t longest : longest_) total += row_bytes * room(longest);
    lists_.grow(device_, 2 * total);
    relaid = true;
  }
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    Region& r = regions_[batch.sequences[s].seq];
    if (r.capacity >= longest_[s] && !r.uploaded.empty()) continue;
    r.capacity = room(longest_[s]);
    r.offset = lists_used_;
    r.epoch = 0;  // epochs start at 1: every list travels whole
    r.uploaded.assign(static_cast<size_t>(l.num_layers) * l.num_kv_heads, 0);
    lists_used_ += row_bytes * static_cast<size_t>(r.capacity);
    relaid = true;
  }
  return relaid;
}

int32_t AttentionViewMirror::listed_pages(const KvLayout& l, size_t view, int32_t h) const {
  if (!l.kivi()) return static_cast<int32_t>(l.pages_per_stream(view_tokens_[view * l.num_kv_heads + h]));
  const KiviTables& t = kivi_tables_[view];
  const int32_t quantized =
      std::max(kivi_ints_[static_cast<size_t>(t.keys + h)], kivi_ints_[static_cast<size_t>(t.values + h)]);
  return (quantized + kivi_group_size_ - 1) / kivi_group_size_;
}

void AttentionViewMirror::keep_kivi_tables(const KiviSeqView& kivi, int32_t num_kv_heads) {
  const int64_t heads = num_kv_heads;
  const auto keep = [&](const int32_t* from, int64_t n) {
    const auto at = static_cast<int64_t>(kivi_ints_.size());
    kivi_ints_.insert(kivi_ints_.end(), from, from + n);
    return at;
  };
  KiviTables t;
  t.keys = keep(kivi.num_quantized_keys, heads);
  t.values = keep(kivi.num_quantized_values, heads);
  t.window = keep(kivi.residual.page_ids, heads * kivi.residual.stride);
  t.window_stride = kivi.residual.stride;
  t.window_tokens = keep(kivi.residual.num_tokens, heads);
  t.first_slot = keep(kivi.residual_first_slot, heads);
  kivi_tables_.push_back(t);
}

void AttentionViewMirror::upload(CacheManager& cache, const ForwardBatch& batch) {
  const KvLayout& l = cache.layout();
  const int32_t L = l.num_layers, H = l.num_kv_heads;
  const auto num_seqs = static_cast<int32_t>(batch.sequences.size());
  selection_used_ = 0;
  retired_selection_buffers_.clear();  // the previous forward has finished with them

  // Every (layer, sequence)'s host view and token counts, and each sequence's longest stream. The page lists stay
  // where the views point (the cache's tables stay put); a KIVI view's window lists and counts sit in scratch that
  // the next layer's build_view reuses, so they are kept here at once.
  host_views_.clear();
  view_tokens_.clear();
  kivi_tables_.clear();
  kivi_ints_.clear();
  longest_.assign(static_cast<size_t>(num_seqs), 0);
  for (int32_t layer = 0; layer < L; ++layer) {
    const AttentionView view = cache.build_view(layer, batch);
    if (layer == 0) {
      q_indptr_.assign(view.q_indptr, view.q_indptr + num_seqs + 1);
      kivi_group_size_ = l.kivi() ? view.quantized.group_size : 0;
    }
    for (int32_t s = 0; s < num_seqs; ++s) {
      host_views_.push_back(view.seqs[s]);
      view_tokens_.insert(view_tokens_.end(), view.seqs[s].num_tokens, view.seqs[s].num_tokens + H);
      if (l.kivi()) keep_kivi_tables(view.quantized.kivi_seqs[s], H);
      for (int32_t h = 0; h < H; ++h)
        longest_[static_cast<size_t>(s)] =
            std::max(longest_[static_cast<size_t>(s)], listed_pages(l, host_views_.size() - 1, h));
    }
  }
  const bool regions_moved = place_regions(l, batch);

  // The header: the SeqKvViews, rewritten when the batch's sequences or their regions changed, then the row
  // offsets and token counts of this forward.
  num_seqs_ = num_seqs;
  q_indptr_offset_ = static_cast<size_t>(L) * static_cast<size_t>(num_seqs) * sizeof(SeqKvView);
  num_tokens_offset_ = align8(q_indptr_offset_ + (static_cast<size_t>(num_seqs) + 1) * sizeof(int32_t));
  const size_t num_tokens_end = align8(num_tokens_offset_ + static_cast<size_t>(num_seqs) * L * H * sizeof(int32_t));
  kivi_offset_ = l.kivi() ? num_tokens_end : 0;
  const size_t header_bytes = num_tokens_end + (l.kivi() ? kivi_views_bytes() : 0);
  // Captured graphs hold the header's addresses (they reach the page lists through the views, so a move of those
  // needs no new capture).
  const bool header_moved = header_.grow(device_, header_bytes);
  if (header_moved) StepGraph::note_buffers_moved();
  char* const header_host = static_cast<char*>(header_.host());
  const char* lists_device = static_cast<const char*>(lists_.device());
  batch_seqs_now_.clear();
  for (const SequenceSlice& slice : batch.sequences) batch_seqs_now_.push_back(slice.seq);
  const bool views_stale = regions_moved || header_moved || batch_seqs_now_ != batch_seqs_;
  if (views_stale) {
    batch_seqs_ = batch_seqs_now_;
    auto* views = reinterpret_cast<SeqKvView*>(header_host);
    const char* header_device = static_cast<const char*>(header_.device());
    for (int32_t layer = 0; layer < L; ++layer) {
      for (int32_t s = 0; s < num_seqs; ++s) {
        const Region& r = regions_.at(batch_seqs_[static_cast<size_t>(s)]);
        SeqKvView& v = views[static_cast<size_t>(layer) * num_seqs + s];
        v = SeqKvView{};
        v.page_ids =
            reinterpret_cast<const int32_t*>(lists_device + r.offset) + static_cast<int64_t>(layer) * H * r.capacity;
        v.stride = r.capacity;
        v.num_tokens = reinterpret_cast<const int32_t*>(header_device + num_tokens_offset_) +
                       (static_cast<int64_t>(s) * L + layer) * H;
      }
    }
  }
  std::memcpy(header_host + q_indptr_offset_, q_indptr_.data(), q_indptr_.size() * sizeof(int32_t));
  auto* num_tokens = reinterpret_cast<int32_t*>(header_host + num_tokens_offset_);
  for (int32_t s = 0; s < num_seqs; ++s)
    for (int32_t layer = 0; layer < L; ++layer)
      std::memcpy(num_tokens + (static_cast<int64_t>(s) * L + layer) * H,
                  view_tokens_.data() + (static_cast<int64_t>(layer) * num_seqs + s) * H,
                  static_cast<size_t>(H) * sizeof(int32_t));
  if (l.kivi()) pack_kivi_views(header_host, static_cast<const char*>(header_.device()));

  // Page lists: the device keeps a sequence's leading pages while its table epoch holds, so only the pages after
  // them travel, as one strided copy of the columns any stream gained (streams grow in step).
  char* const lists_host = static_cast<char*>(lists_.host());
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t seq = batch_seqs_[static_cast<size_t>(s)];
    Region& r = regions_.at(seq);
    const uint64_t epoch = cache.table_epoch(seq);
    if (r.epoch != epoch) std::fill(r.uploaded.begin(), r.uploaded.end(), 0);
    r.epoch = epoch;
    auto* rows = reinterpret_cast<int32_t*>(lists_host + r.offset);
    int32_t first = std::numeric_limits<int32_t>::max(), last = 0;  // the columns to send
    for (int32_t layer = 0; layer < L; ++layer) {
      const size_t view = static_cast<size_t>(layer) * num_seqs + s;
      const SeqKvView& v = host_views_[view];
      for (int32_t h = 0; h < H; ++h) {
        const int64_t row = static_cast<int64_t>(layer) * H + h;
        const int32_t num_pages = listed_pages(l, view, h);
        int32_t& uploaded = r.uploaded[static_cast<size_t>(row)];
        const int32_t held = std::min(uploaded, num_pages);
        uploaded = num_pages;
        if (num_pages == held) continue;
        std::memcpy(rows + row * r.capacity + held, v.page_ids + static_cast<int64_t>(h) * v.stride + held,
                    static_cast<size_t>(num_pages - held) * sizeof(int32_t));
        first = std::min(first, held);
        last = std::max(last, num_pages);
      }
    }
    // Columns a stream did not gain are resent as the device already holds them.
    if (last > first) {
      const size_t pitch = static_cast<size_t>(r.capacity) * sizeof(int32_t);
      const size_t at = r.offset + static_cast<size_t>(first) * sizeof(int32_t);
      copy_rows_async(device_, static_cast<char*>(lists_.device()) + at, pitch, lists_host + at, pitch,
                      static_cast<size_t>(last - first) * sizeof(int32_t), static_cast<size_t>(L) * H);
      bytes_sent_ += static_cast<uint64_t>(last - first) * sizeof(int32_t) * static_cast<uint64_t>(L) * H;
    }
  }
  // The header last: copy_bytes waits for the stream, so the staging memory is free to change at the next upload.
  const size_t header_from = views_stale ? 0 : q_indptr_offset_;
  copy_bytes(device_, static_cast<char*>(header_.device()) + header_from, header_host + header_from,
             header_bytes - header_from);
  bytes_sent_ += header_bytes - header_from;
}

size_t AttentionViewMirror::kivi_views_bytes() const {
  return align8(kivi_tables_.size() * sizeof(KiviSeqView)) + kivi_ints_.size() * sizeof(int32_t);
}

void AttentionViewMirror::pack_kivi_views(char* header_host, const char* header_device) {
  const size_t ints_offset = kivi_offset_ + align8(kivi_tables_.size() * sizeof(KiviSeqView));
  std::memcpy(header_host + ints_offset, kivi_ints_.data(), kivi_ints_.size() * sizeof(int32_t));
  const auto* ints = reinterpret_cast<const int32_t*>(header_device + ints_offset);
  auto* views = reinterpret_cast<KiviSeqView*>(header_host + kivi_offset_);
  for (size_t i = 0; i < kivi_tables_.size(); ++i) {
    const KiviTables& t = kivi_tables_[i];
    views[i] = KiviSeqView{ints + t.keys, ints + t.values,
                           SeqKvView{ints + t.window, t.window_stride, ints + t.window_tokens}, ints + t.first_slot};
  }
}

AttentionView AttentionViewMirror::device_view(int layer, const AttentionView& host_view) {
  SE_CHECK(host_view.num_seqs == num_seqs_, "device view of {} sequences, {} uploaded", host_view.num_seqs, num_seqs_);
  const char* header_device = static_cast<const char*>(header_.device());
  AttentionView view = host_view;
  view.q_indptr = reinterpret_cast<const int32_t*>(header_device + q_indptr_offset_);
  const size_t first = static_cast<size_t>(layer) * static_cast<size_t>(num_seqs_);
  view.seqs = reinterpret_cast<const SeqKvView*>(header_device) + first;
  view.tables_device = device_;
  if (kivi_offset_ != 0) {
    SE_CHECK(!host_view.has_selection, "attention view mirror: a selection over KIVI pages is not implemented");
    view.quantized.kivi_seqs = reinterpret_cast<const KiviSeqView*>(header_device + kivi_offset_) + first;
  }
  // A batch-wide produced selection travels by value in the view: the dense device views serve as they are.
  if (host_view.has_selection && host_view.produced.lists == nullptr)
    view.seqs = upload_selection(host_view, reinterpret_cast<const SeqKvView*>(header_.host()) + first);
  return view;
}

const SeqKvView* AttentionViewMirror::upload_selection(const AttentionView& host_view, const SeqKvView* views) {
  // Packed: SeqKvView [num_seqs] | per selected sequence: counts [num_kv_heads] then lists [num_kv_heads][stride]
  // (produced lists stay where their op wrote them: only the views travel).
  const int32_t num_heads = host_view.num_kv_heads;
  size_t num_bytes = align8(static_cast<size_t>(num_seqs_) * sizeof(SeqKvView));
  for (int32_t s = 0; s < num_seqs_; ++s) {
    const SeqKvView& seq = host_view.seqs[s];
    if (seq.selected != nullptr && !host_view.selection_produced)
      num_bytes +=
          align8(static_cast<size_t>(num_heads) * static_cast<size_t>(1 + seq.selected_stride) * sizeof(int32_t));
  }
  if (!selection_buffer_.defined() || selection_used_ + num_bytes > selection_buffer_.nbytes()) {
    const size_t previous = selection_buffer_.defined() ? selection_buffer_.nbytes() : 0;
    if (selection_buffer_.defined()) {
      retired_selection_buffers_.push_back(std::move(selection_buffer_));
      retired_selection_buffers_.push_back(std::move(selection_staging_));
    }
    const auto capacity = static_cast<int64_t>(std::max(4 * num_bytes, 2 * previous));
    selection_buffer_ = empty_on(device_, DType::kU8, {capacity});
    selection_staging_ = Tensor::empty(DType::kU8, {capacity}, staging_allocator(device_));
    SE_CHECK(selection_staging_.raw() != nullptr, "no host memory to stage {} bytes of selections", capacity);
    selection_used_ = 0;
  }
  char* device_base = static_cast<char*>(selection_buffer_.raw()) + selection_used_;
  // The forward's own staging region: the copy below runs when the stream reaches it, so nothing may reuse it
  // before the next forward.
  char* host = static_cast<char*>(selection_staging_.raw()) + selection_used_;
  auto* packed = reinterpret_cast<SeqKvView*>(host);
  size_t offset = align8(static_cast<size_t>(num_seqs_) * sizeof(SeqKvView));
  for (int32_t s = 0; s < num_seqs_; ++s) {
    const SeqKvView& seq = host_view.seqs[s];
    packed[s] = views[s];
    if (seq.selected == nullptr) continue;
    if (host_view.selection_produced) {  // the lists are on the device already
      packed[s].selected = seq.selected;
      packed[s].selected_stride = seq.selected_stride;
      packed[s].num_selected = seq.num_selected;
      continue;
    }
    const size_t list_bytes =
        static_cast<size_t>(num_heads) * static_cast<size_t>(seq.selected_stride) * sizeof(int32_t);
    auto* counts = reinterpret_cast<int32_t*>(host + offset);
    std::memcpy(counts, seq.num_selected, static_cast<size_t>(num_heads) * sizeof(int32_t));
    std::memcpy(counts + num_heads, seq.selected, list_bytes);
    packed[s].num_selected = reinterpret_cast<const int32_t*>(device_base + offset);
    packed[s].selected = packed[s].num_selected + num_heads;
    packed[s].selected_stride = seq.selected_stride;
    offset += align8(static_cast<size_t>(num_heads) * sizeof(int32_t) + list_bytes);
  }
  copy_bytes_async(device_, device_base, host, num_bytes);
  selection_used_ += num_bytes;
  return reinterpret_cast<const SeqKvView*>(device_base);
}

}  // namespace se
