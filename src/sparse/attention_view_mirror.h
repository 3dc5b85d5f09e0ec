// AttentionViewMirror: the device copy of one forward's AttentionViews. CacheManager::build_view points into
// host page tables; CUDA kernels need the row offsets, per-sequence views and page lists in device memory.
//
// The device keeps every batch sequence's page lists between forwards, in a region per sequence with room to
// grow. At the start of each forward the mirror sends the row offsets and token counts, and of the page lists
// only what changed: the pages appended since the last forward (one strided copy per sequence, every page_size
// decode steps), or a sequence's whole lists when its table was rewritten (CacheManager::table_epoch) or another
// sequence took its place. A new batch size or a sequence outgrowing its region lays the regions out anew and
// sends everything, as does the first forward. So a long context costs its page lists once, not every step.
//
// A layer whose view carries a selection (dynamic sparse methods pick it inside the forward) gets its
// per-sequence views and selected lists copied when attention asks for it, into that forward's own region of a
// second buffer, so layers still queued on the stream keep reading theirs; that copy does not wait for the
// stream. A selection produced for the whole batch in one layout (AttentionView::produced) needs no copy: the
// device view carries it by value, so such a forward enqueues no host copy after upload() and a CUDA graph can
// replay it. Valid while the cache's tables are unchanged, i.e. until the forward's method hooks evict.
// The device buffer grows geometrically, so a steady decode allocates nothing; generation() counts its moves.
// Engine thread only.
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
  // Places the header and a region per sequence (room for a quarter more pages than its longest stream holds,
  // longest_ per sequence) for `num_seqs` sequences, writes every SeqKvView, and forgets what the device holds.
  void lay_out(const KvLayout& layout, int32_t num_seqs);
  // Device copies of host_view's selected lists, with `views` (the layer's mirrored SeqKvViews) pointing at them.
  const SeqKvView* upload_selection(const AttentionView& host_view, const SeqKvView* views);

  Device device_;
  int32_t num_seqs_ = 0;
  Tensor host_;           // [capacity] bytes of staging memory: the packed layout below as the device holds it once
                          // the forward's copies ran, with device addresses in its SeqKvViews
  Tensor device_buffer_;  // [capacity] bytes on device_
  // Packed layout: SeqKvView [num_layers][num_seqs] | q_indptr [num_seqs + 1] | num_tokens [num_seqs][num_layers]
  // [num_kv_heads] | per sequence, its region: page ids [num_layers][num_kv_heads][its capacity].
  size_t q_indptr_offset_ = 0;
  size_t num_tokens_offset_ = 0;
  size_t header_bytes_ = 0;
  bool views_sent_ = false;  // the device holds the SeqKvViews lay_out wrote
  struct Region {
    int32_t seq = -1;    // the cache sequence whose lists the device holds here; -1 = none
    uint64_t epoch = 0;  // its table_epoch when they were sent
    int32_t capacity = 0;
    size_t offset = 0;
  };
  std::vector<Region> regions_;     // [num_seqs]
  std::vector<int32_t> uploaded_;   // [num_seqs][num_layers][num_kv_heads]: leading page ids the device holds
  std::vector<int32_t> longest_;    // upload()'s scratch: each sequence's longest stream, in pages
  uint64_t generation_ = 0;

  // Selections of the current forward: packed at selection_used_ bytes into pinned selection_staging_ and copied
  // to the same offset of selection_buffer_ without waiting. A pair that overflows mid-forward is retired (copies
  // and layers queued before still use it) and freed at the next upload.
  Tensor selection_buffer_;
  Tensor selection_staging_;
  size_t selection_used_ = 0;
  std::vector<Tensor> retired_selection_buffers_;
  // upload()'s scratch: the host views of every (layer, sequence) and the row offsets.
  std::vector<SeqKvView> host_views_;
  std::vector<int32_t> q_indptr_;
};

}  // namespace se
