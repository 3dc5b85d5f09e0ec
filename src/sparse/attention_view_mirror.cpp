#include "sparse/attention_view_mirror.h"

#include <algorithm>
#include <cstring>

#include "backend/device_memory.h"
#include "base/check.h"

namespace se {

namespace {
size_t align8(size_t n) { return (n + 7) / 8 * 8; }
}  // namespace

void AttentionViewMirror::reserve(size_t num_bytes) {
  if (device_buffer_.defined() && device_buffer_.nbytes() >= num_bytes) return;
  const size_t grown = std::max(num_bytes, device_buffer_.defined() ? 2 * device_buffer_.nbytes() : 0);
  device_buffer_ = Tensor();  // free first: the stream is idle between steps, so nothing still reads it
  device_buffer_ = empty_on(device_, DType::kU8, {static_cast<int64_t>(grown)});
  ++generation_;
  // Padding between the packed tables is never read, so the staging copy needs no clearing.
  host_ = Tensor::empty(DType::kU8, {static_cast<int64_t>(grown)}, staging_allocator(device_));
  SE_CHECK(host_.raw() != nullptr, "no host memory to stage {} bytes of page tables", grown);
}

void AttentionViewMirror::upload(CacheManager& cache, const ForwardBatch& batch) {
  const KvLayout& l = cache.layout();
  num_seqs_ = static_cast<int32_t>(batch.sequences.size());
  selection_used_ = 0;
  retired_selection_buffers_.clear();  // the previous forward has finished with them
  const size_t num_views = static_cast<size_t>(l.num_layers) * static_cast<size_t>(num_seqs_);
  q_indptr_offset_ = num_views * sizeof(SeqKvView);
  const size_t tables_offset = align8(q_indptr_offset_ + (static_cast<size_t>(num_seqs_) + 1) * sizeof(int32_t));

  // First pass: every (layer, sequence)'s host view (its pointers reach the cache's page tables, which stay put)
  // and table size, so the device buffer is sized before addresses are known.
  host_views_.clear();
  strides_.clear();
  size_t num_bytes = tables_offset;
  for (int layer = 0; layer < l.num_layers; ++layer) {
    const AttentionView view = cache.build_view(layer, batch);
    if (layer == 0) q_indptr_.assign(view.q_indptr, view.q_indptr + num_seqs_ + 1);
    for (int32_t s = 0; s < num_seqs_; ++s) {
      const int32_t* num_tokens = view.seqs[s].num_tokens;
      const auto stride =
          static_cast<int32_t>(l.pages_per_stream(*std::max_element(num_tokens, num_tokens + l.num_kv_heads)));
      host_views_.push_back(view.seqs[s]);
      strides_.push_back(stride);
      num_bytes += align8(static_cast<size_t>(l.num_kv_heads) * static_cast<size_t>(1 + stride) * sizeof(int32_t));
    }
  }
  reserve(num_bytes);
  char* const host = static_cast<char*>(host_.raw());
  char* device_base = static_cast<char*>(device_buffer_.raw());

  std::memcpy(host + q_indptr_offset_, q_indptr_.data(), q_indptr_.size() * sizeof(int32_t));
  auto* views = reinterpret_cast<SeqKvView*>(host);
  size_t offset = tables_offset;
  for (size_t i = 0; i < num_views; ++i) {
    const SeqKvView& seq = host_views_[i];
    const int32_t stride = strides_[i];
    auto* num_tokens = reinterpret_cast<int32_t*>(host + offset);
    int32_t* page_ids = num_tokens + l.num_kv_heads;
    std::memcpy(num_tokens, seq.num_tokens, static_cast<size_t>(l.num_kv_heads) * sizeof(int32_t));
    for (int32_t h = 0; h < l.num_kv_heads; ++h)
      std::memcpy(page_ids + static_cast<int64_t>(h) * stride, seq.page_ids + static_cast<int64_t>(h) * seq.stride,
                  static_cast<size_t>(l.pages_per_stream(seq.num_tokens[h])) * sizeof(int32_t));
    SeqKvView& mirrored = views[i];  // [layer][seq], the order of the first pass
    mirrored = SeqKvView{};  // no selection: the staging memory is not cleared between steps
    mirrored.num_tokens = reinterpret_cast<const int32_t*>(device_base + offset);
    mirrored.page_ids = reinterpret_cast<const int32_t*>(device_base + offset) + l.num_kv_heads;
    mirrored.stride = stride;
    offset += align8(static_cast<size_t>(l.num_kv_heads) * static_cast<size_t>(1 + stride) * sizeof(int32_t));
  }
  copy_bytes(device_, device_base, host, num_bytes);
}

AttentionView AttentionViewMirror::device_view(int layer, const AttentionView& host_view) {
  SE_CHECK(host_view.num_seqs == num_seqs_, "device view of {} sequences, {} uploaded", host_view.num_seqs, num_seqs_);
  const char* device_base = static_cast<const char*>(device_buffer_.raw());
  AttentionView view = host_view;
  view.q_indptr = reinterpret_cast<const int32_t*>(device_base + q_indptr_offset_);
  const size_t first = static_cast<size_t>(layer) * static_cast<size_t>(num_seqs_);
  view.seqs = reinterpret_cast<const SeqKvView*>(device_base) + first;
  if (host_view.has_selection)
    view.seqs = upload_selection(host_view, reinterpret_cast<const SeqKvView*>(host_.raw()) + first);
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
      num_bytes += align8(static_cast<size_t>(num_heads) * static_cast<size_t>(1 + seq.selected_stride) * sizeof(int32_t));
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
    const size_t list_bytes = static_cast<size_t>(num_heads) * static_cast<size_t>(seq.selected_stride) * sizeof(int32_t);
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
