// Selection: what a dynamic-selection method lets one layer's attention read, per sequence of the batch and
// KV head: an ascending list of token indices or page indices into that head's stream. Built by the
// method's build_*_selection hooks, then applied to the dense AttentionView the cache built. Reused across
// layers and steps (no allocation once warm). Engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/attention_view.h"

namespace se {

class Selection {
 public:
  // Empties the selection for a batch of `num_seqs` sequences with `num_kv_heads` heads each.
  void reset(int32_t num_seqs, int32_t num_kv_heads, SelectionUnit unit);
  // Restricts sequence `seq` (its index in the batch), KV head `kv_head` to `indices` (ascending).
  void set(int32_t seq, int32_t kv_head, std::span<const int32_t> indices);
  bool empty() const { return num_selected_seqs_ == 0; }
  SelectionUnit unit() const { return unit_; }
  // The selected indices of (seq, kv_head); null when that sequence is not restricted.
  const std::vector<int32_t>* get(int32_t seq, int32_t kv_head) const;

  // `dense` narrowed to this selection; valid while both this selection and `dense`'s tables are.
  AttentionView apply(const AttentionView& dense);

 private:
  SelectionUnit unit_ = SelectionUnit::kToken;
  int32_t num_seqs_ = 0;
  int32_t num_kv_heads_ = 0;
  int32_t num_selected_seqs_ = 0;
  std::vector<std::vector<int32_t>> lists_;  // [num_seqs][num_kv_heads]
  std::vector<uint8_t> is_selected_;         // [num_seqs]
  std::vector<int32_t> flat_;                // per selected sequence: [num_kv_heads][stride] indices
  std::vector<int32_t> counts_;              // per selected sequence: [num_kv_heads]
  std::vector<SeqKvView> seqs_;              // the applied view's sequences
};

}  // namespace se
