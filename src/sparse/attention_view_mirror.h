// AttentionViewMirror: the device copy of one forward's AttentionViews. CacheManager::build_view points into
// host page tables; CUDA kernels need the row offsets, per-sequence views and page lists in device memory.
//
// The device keeps each sequence's page lists between forwards, in a region of its own with room to grow, for as
// long as the sequence keeps coming back: a batch that changes (a request joins or finishes, a prefill chunk
// rides along) moves no lists. At the start of each forward the mirror sends the row offsets and token counts
// (and the per-sequence views when the batch's sequences changed), and of the page lists only what changed: the
// pages appended since the sequence's last forward (one strided copy per sequence, every page_size decode steps),
// or its whole lists when its table was rewritten (CacheManager::table_epoch) or it has no region yet. So a long
// context costs its page lists once, not every step.
//
// A layer whose view carries a selection (dynamic sparse methods pick it inside the forward) gets its
// per-sequence views and selected lists copied when attention asks for it, into that forward's own region of a
// second buffer, so layers still queued on the stream keep reading theirs; that copy does not wait for the
// stream. A selection produced for the whole batch in one layout (AttentionView::produced) needs no copy: the
// device view carries it by value, so such a forward enqueues no host copy after upload() and a CUDA graph can
// replay it. Valid while the cache's tables are unchanged, i.e. until the forward's method hooks evict.
// The buffers grow geometrically, so a steady decode allocates nothing; a move of the header notes
// StepGraph::note_buffers_moved.
//
// A KIVI cache's views (attention_view.h, kKivi) list each stream's quantized groups where others list pages: those
// lists live in the regions the same way (a stream's groups only grow at the end while its table epoch holds), and
// only the groups its counts reach travel. Its sliding window's short lists and counts change at both ends every
// step, so they and the per-sequence KiviSeqViews are packed into the header after the token counts and sent with
// every forward. Engine thread only.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/attention_view.h"
#include "backend/staged_buffer.h"
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
  // Bytes of views and page lists sent to the device so far (selections excluded).
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  // Gives every batch sequence a region of page lists with room for its longest stream (longest_) and a quarter
  // more: a sequence keeps its region while it fits; new and outgrown ones take fresh room at the end of the
  // lists buffer, and when that is full, only this batch's sequences are laid out anew, in twice the room they
  // take. True when a batch sequence's region is new or moved.
  bool place_regions(const KvLayout& layout, const ForwardBatch& batch);
  // Device copies of host_view's selected lists, with `views` (the layer's mirrored SeqKvViews) pointing at them.
  const SeqKvView* upload_selection(const AttentionView& host_view, const SeqKvView* views);

  // A KIVI forward's window lists and counts into the header from kivi_offset_ (KiviSeqView [num_layers][num_seqs],
  // then their ints), pointing at header_device.
  void pack_kivi_views(char* header_host, const char* header_device);
  // The bytes pack_kivi_views takes for the kept tables.
  size_t kivi_views_bytes() const;
  // Keeps a KIVI host view's window list and counts in kivi_ints_ (the order pack_kivi_views sends them in).
  void keep_kivi_tables(const KiviSeqView& kivi, int32_t num_kv_heads);
  // Leading entries of the list of stream h of host view `view` that the device needs: the pages its tokens fill,
  // or the KIVI groups its quantized keys or values reach.
  int32_t listed_pages(const KvLayout& layout, size_t view, int32_t h) const;

  Device device_;
  // The header of the uploaded forward: SeqKvView [num_layers][num_seqs] | q_indptr [num_seqs + 1] | num_tokens
  // [num_seqs][num_layers][num_kv_heads] (| a KIVI forward's views), the SeqKvViews pointing into the regions of the
  // lists buffer.
  StagedBuffer header_;
  int32_t num_seqs_ = 0;
  size_t q_indptr_offset_ = 0;
  size_t num_tokens_offset_ = 0;
  size_t kivi_offset_ = 0;           // 0: not a KIVI forward
  std::vector<int32_t> batch_seqs_;  // the cache sequences whose views the header holds, in batch order
  // Per cache sequence, its region of the lists buffer: page ids [num_layers][num_kv_heads][capacity]. A region
  // outlives its sequence until the buffer is next laid out; a new sequence under the same id has another table
  // epoch, so its lists travel whole.
  struct Region {
    size_t offset = 0;
    int32_t capacity = 0;
    uint64_t epoch = 0;             // the sequence's table_epoch when its lists were last sent
    std::vector<int32_t> uploaded;  // [num_layers][num_kv_heads]: leading page ids the device holds per stream
  };
  StagedBuffer lists_;
  size_t lists_used_ = 0;
  std::unordered_map<int32_t, Region> regions_;
  uint64_t bytes_sent_ = 0;

  // Selections of the current forward: packed at selection_used_ bytes into pinned selection_staging_ and copied
  // to the same offset of selection_buffer_ without waiting. A pair that overflows mid-forward is retired (copies
  // and layers queued before still use it) and freed at the next upload.
  Tensor selection_buffer_;
  Tensor selection_staging_;
  size_t selection_used_ = 0;
  std::vector<Tensor> retired_selection_buffers_;
  // upload()'s scratch: the host views of every (layer, sequence) and their token counts [layer][seq][head], the
  // row offsets, each sequence's longest stream in listed pages, the batch's sequences.
  std::vector<SeqKvView> host_views_;
  std::vector<int32_t> view_tokens_;
  // A KIVI forward's window lists and counts of every (layer, sequence), as offsets into kivi_ints_.
  struct KiviTables {
    int64_t keys = 0, values = 0, window = 0, window_tokens = 0, first_slot = 0;
    int32_t window_stride = 0;
  };
  std::vector<KiviTables> kivi_tables_;
  std::vector<int32_t> kivi_ints_;
  int32_t kivi_group_size_ = 0;
  std::vector<int32_t> q_indptr_;
  std::vector<int32_t> longest_;
  std::vector<int32_t> batch_seqs_now_;
};

}  // namespace se
