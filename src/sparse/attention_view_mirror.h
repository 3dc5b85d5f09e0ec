// AttentionViewMirror: the device copy of one forward's AttentionViews. CacheManager::build_view points into
// host page tables; CUDA kernels need the row offsets, per-sequence views and page lists in device memory. At
// the start of each forward the mirror packs every layer's view of the batch into one host buffer (page lists
// cut to the pages each stream holds) and copies it to the device in one transfer; each layer then reads its
// device view. A layer whose view carries a selection (dynamic sparse methods pick it inside the forward) gets
// its per-sequence views and selected lists copied when attention asks for it, into that forward's own region
// of a second buffer, so layers still queued on the stream keep reading theirs; that copy does not wait for the
// stream. Valid while the cache's tables
// are unchanged, i.e. until the forward's method hooks evict. Engine thread only.
// NOTE: the device buffer grows geometrically, so a steady decode allocates nothing; a CUDA graph capture would
// need it sized for its bucket's worst case first, and the copy staged through pinned memory.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/attention_view.h"
#include "sparse/cache_manager.h"
#include "tensor/tensor.h"

namespace se {

class AttentionViewMirror final {
 public:
  explicit AttentionViewMirror(Device device) : device_(device) {}

  // Packs and copies the views of every layer of `batch` from `cache` (after its reserve for this step).
  void upload(CacheManager& cache, const ForwardBatch& batch);
  // The device twin of `host_view` (the cache's view of layer `layer` of the uploaded batch, or that view narrowed
  // by a Selection): same pool and layout, device tables.
  AttentionView device_view(int layer, const AttentionView& host_view);
  // Counts moves of the packed-view buffer (CUDA graphs captured over the old one are stale).
  uint64_t generation() const { return generation_; }

 private:
  // Room for `num_bytes` of packed views (grows geometrically, so steady decoding stops allocating).
  void reserve(size_t num_bytes);
  // Device copies of host_view's selected lists, with `views` (the layer's mirrored SeqKvViews) pointing at them.
  const SeqKvView* upload_selection(const AttentionView& host_view, const SeqKvView* views);

  Device device_;
  int32_t num_seqs_ = 0;
  Tensor host_;              // [capacity] bytes of staging memory: the packed layout below, with device addresses
                             // in its SeqKvViews
  Tensor device_buffer_;     // [capacity] bytes on device_
  // Packed layout: SeqKvView [num_layers][num_seqs] | q_indptr [num_seqs + 1] | per (layer, seq): num_tokens
  // [num_kv_heads] then page ids [num_kv_heads][stride] (stride = that sequence's most pages in the layer).
  size_t q_indptr_offset_ = 0;
  uint64_t generation_ = 0;

  // Selections of the current forward: packed at selection_used_ bytes into pinned selection_staging_ and copied
  // to the same offset of selection_buffer_ without waiting. A pair that overflows mid-forward is retired (copies
  // and layers queued before still use it) and freed at the next upload.
  Tensor selection_buffer_;
  Tensor selection_staging_;
  size_t selection_used_ = 0;
  std::vector<Tensor> retired_selection_buffers_;
  // upload()'s scratch: the host views of every (layer, sequence), their page-list strides, the row offsets.
  std::vector<SeqKvView> host_views_;
  std::vector<int32_t> strides_;
  std::vector<int32_t> q_indptr_;
};

}  // namespace se
