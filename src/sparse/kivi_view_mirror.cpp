#include "sparse/kivi_view_mirror.h"

#include <algorithm>
#include <cstring>

#include "backend/device_memory.h"
#include "backend/step_graph.h"
#include "base/check.h"

namespace se {

namespace {
size_t align8(size_t n) { return (n + 7) / 8 * 8; }
}  // namespace

int64_t KiviViewMirror::pack(const int32_t* from, int64_t n) {
  const auto at = static_cast<int64_t>(ints_.size());
  ints_.insert(ints_.end(), from, from + n);
  return at;
}

void KiviViewMirror::upload(CacheManager& cache, const ForwardBatch& batch) {
  const KvLayout& l = cache.layout();
  const int32_t num_layers = l.num_layers, heads = l.num_kv_heads;
  const auto num_seqs = static_cast<int32_t>(batch.sequences.size());
  ints_.clear();
  packed_.clear();
  for (int32_t layer = 0; layer < num_layers; ++layer) {
    // Each build_view reuses the cache's scratch tables: pack this layer's before the next.
    const AttentionView view = cache.build_view(layer, batch);
    SE_CHECK(is_kivi_view(view), "kivi view mirror: the cache's views are not KIVI's");
    if (layer == 0) q_indptr_.assign(view.q_indptr, view.q_indptr + num_seqs + 1);
    for (int32_t s = 0; s < num_seqs; ++s) {
      const SeqKvView& sv = view.seqs[s];
      const KiviSeqView& kivi = view.quantized.kivi_seqs[s];
      PackedTables p{};
      p.stride_q = sv.stride;
      p.stride_r = kivi.residual.stride;
      p.quantized = pack(sv.page_ids, int64_t{heads} * sv.stride);
      p.num_tokens = pack(sv.num_tokens, heads);
      p.keys = pack(kivi.num_quantized_keys, heads);
      p.values = pack(kivi.num_quantized_values, heads);
      p.residual = pack(kivi.residual.page_ids, int64_t{heads} * kivi.residual.stride);
      p.residual_tokens = pack(kivi.residual.num_tokens, heads);
      p.first_slot = pack(kivi.residual_first_slot, heads);
      packed_.push_back(p);
    }
  }

  // [q_indptr | SeqKvView [L][S] | KiviSeqView [L][S] | ints].
  const size_t num_views = static_cast<size_t>(num_layers) * static_cast<size_t>(num_seqs);
  seqs_offset_ = align8((static_cast<size_t>(num_seqs) + 1) * sizeof(int32_t));
  kivi_offset_ = align8(seqs_offset_ + num_views * sizeof(SeqKvView));
  const size_t ints_offset = align8(kivi_offset_ + num_views * sizeof(KiviSeqView));
  const size_t num_bytes = ints_offset + ints_.size() * sizeof(int32_t);
  if (!device_tables_.defined() || device_tables_.nbytes() < num_bytes) {
    const size_t grown = std::max(num_bytes, device_tables_.defined() ? 2 * device_tables_.nbytes() : size_t{0});
    device_tables_ = Tensor();  // the stream is idle between forwards: nothing reads the old buffer
    device_tables_ = empty_on(device_, DType::kU8, {static_cast<int64_t>(grown)});
    host_tables_ = Tensor::empty(DType::kU8, {static_cast<int64_t>(grown)}, staging_allocator(device_));
    SE_CHECK(device_tables_.raw() != nullptr && host_tables_.raw() != nullptr,
             "no memory for {} bytes of KIVI page tables", grown);
    StepGraph::note_buffers_moved();  // captured graphs read the views at the old address
  }
  num_seqs_ = num_seqs;
  char* host = static_cast<char*>(host_tables_.raw());
  const auto* device_ints =
      reinterpret_cast<const int32_t*>(static_cast<const char*>(device_tables_.raw()) + ints_offset);
  std::memcpy(host, q_indptr_.data(), q_indptr_.size() * sizeof(int32_t));
  auto* seqs = reinterpret_cast<SeqKvView*>(host + seqs_offset_);
  auto* kivi = reinterpret_cast<KiviSeqView*>(host + kivi_offset_);
  for (size_t i = 0; i < num_views; ++i) {
    const PackedTables& p = packed_[i];
    seqs[i] = SeqKvView{device_ints + p.quantized, p.stride_q, device_ints + p.num_tokens};
    kivi[i] = KiviSeqView{device_ints + p.keys, device_ints + p.values,
                          SeqKvView{device_ints + p.residual, p.stride_r, device_ints + p.residual_tokens},
                          device_ints + p.first_slot};
  }
  std::memcpy(host + ints_offset, ints_.data(), ints_.size() * sizeof(int32_t));
  copy_bytes(device_, device_tables_.raw(), host, num_bytes);  // waits: the staging is free at the next upload
  bytes_sent_ += num_bytes;
}

AttentionView KiviViewMirror::device_view(int layer, const AttentionView& host_view) const {
  SE_CHECK(host_view.num_seqs == num_seqs_, "device view of {} sequences, {} uploaded", host_view.num_seqs, num_seqs_);
  SE_CHECK(!host_view.has_selection, "kivi view mirror: a selection over KIVI pages is not implemented");
  const char* base = static_cast<const char*>(device_tables_.raw());
  const size_t first = static_cast<size_t>(layer) * static_cast<size_t>(num_seqs_);
  AttentionView view = host_view;
  view.q_indptr = reinterpret_cast<const int32_t*>(base);
  view.seqs = reinterpret_cast<const SeqKvView*>(base + seqs_offset_) + first;
  view.quantized.kivi_seqs = reinterpret_cast<const KiviSeqView*>(base + kivi_offset_) + first;
  view.tables_device = device_;
  return view;
}

}  // namespace se
