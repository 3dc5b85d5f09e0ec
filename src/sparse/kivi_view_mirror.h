// KiviViewMirror: the device copy of one forward's KIVI views (attention_view.h, kKivi), which AttentionViewMirror
// keeps for a KIVI cache. A KIVI stream's lists change at both ends (its window drops the pages it slid past, its
// groups gain pages), so each forward sends every layer's tables whole, in one copy: the row offsets, the per-sequence
// views [num_layers][num_seqs] (SeqKvView, then KiviSeqView), then the lists and counts they point to. The views come
// first, at offsets that depend only on the batch's shape, so a decode step of the same batch size reads them where a
// captured CUDA graph does; the buffer grows geometrically and a move notes StepGraph::note_buffers_moved. A step
// sends about (quantized pages + window pages + 5) ints per stream and sequence. Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/attention_view.h"
#include "sparse/cache_manager.h"
#include "tensor/tensor.h"

namespace se {

class KiviViewMirror final {
 public:
  explicit KiviViewMirror(Device device) : device_(device) {}

  // Packs and copies the views of every layer of `batch` from `cache` (a KIVI cache, after its reserve).
  void upload(CacheManager& cache, const ForwardBatch& batch);
  // The device twin of `host_view`, the cache's view of layer `layer` of the uploaded batch.
  AttentionView device_view(int layer, const AttentionView& host_view) const;
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  // Where one (layer, sequence)'s tables start among the packed ints.
  struct PackedTables {
    int64_t quantized, num_tokens, keys, values, residual, residual_tokens, first_slot;
    int32_t stride_q, stride_r;
  };
  // Appends n ints from `from` to ints_ and returns where they start.
  int64_t pack(const int32_t* from, int64_t n);

  Device device_;
  Tensor host_tables_;    // pinned staging of the whole copy
  Tensor device_tables_;  // its device twin
  int32_t num_seqs_ = 0;
  size_t seqs_offset_ = 0, kivi_offset_ = 0;
  uint64_t bytes_sent_ = 0;
  // upload()'s scratch.
  std::vector<int32_t> ints_;
  std::vector<PackedTables> packed_;  // [num_layers][num_seqs]
  std::vector<int32_t> q_indptr_;
};

}  // namespace se
