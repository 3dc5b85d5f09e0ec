// AttentionViewMirror: the device copy of one forward's AttentionViews. CacheManager::build_view points into
// host page tables; CUDA kernels need the row offsets, per-sequence views and page lists in device memory. At
// the start of each forward the mirror packs every layer's view of the batch into one host buffer (page lists
// cut to the pages each stream holds) and copies it to the device in one transfer; each layer then reads its
// device view. Valid while the cache's tables are unchanged, i.e. for methods that do not evict or select during
// the forward (the engine admits only those on CUDA). Engine thread only.
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
  // The device twin of `host_view` (the cache's view of layer `layer` of the uploaded batch): same pool and
  // layout, device tables. Selections are not mirrored: host_view must have none.
  AttentionView device_view(int layer, const AttentionView& host_view) const;

 private:
  // Room for `num_bytes` of packed views (grows geometrically, so steady decoding stops allocating).
  void reserve(size_t num_bytes);

  Device device_;
  int32_t num_seqs_ = 0;
  std::vector<char> host_;   // the packed layout below, with device addresses in its SeqKvViews
  Tensor device_buffer_;     // [capacity] bytes on device_
  // Packed layout: SeqKvView [num_layers][num_seqs] | q_indptr [num_seqs + 1] | per (layer, seq): num_tokens
  // [num_kv_heads] then page ids [num_kv_heads][stride] (stride = that sequence's most pages in the layer).
  size_t q_indptr_offset_ = 0;
};

}  // namespace se
