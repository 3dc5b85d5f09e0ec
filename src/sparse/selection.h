// Selection: what a dynamic-selection method lets one layer's attention read, per sequence of the batch and
// KV head: an ascending list of token indices or page indices into that head's stream. Built by the
// method's build_*_selection hooks, then applied to the dense AttentionView the cache built. A hook gives a
// sequence's lists either as host vectors (set) or as an op's output where the KV pool lives (set_produced: a GPU
// method ranks on the device and the lists never visit the host). Reused across layers and steps (no allocation
// once warm). Engine thread only.
#pragma once

#include <cstdint>
#include <optional>
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
  // Restricts every KV head of sequence `seq` to lists an op wrote where the pool lives: head h's ascending
  // indices at lists + h * stride, counts[h] of them. They must stay unchanged until the layer's attention has
  // read them. `tokens_read` is the tokens the sequence's last query row reads over all heads (the host cannot
  // read device lists to count them). A batch's lists are all host lists or all produced.
  void set_produced(int32_t seq, const int32_t* lists, int32_t stride, const int32_t* counts, int64_t tokens_read);
  bool empty() const { return num_selected_seqs_ == 0; }
  SelectionUnit unit() const { return unit_; }
  // The selected indices of (seq, kv_head); nullopt when that sequence is not restricted. Produced lists are
  // readable here only when the pool is host memory.
  std::optional<std::span<const int32_t>> get(int32_t seq, int32_t kv_head) const;
  // Tokens sequence `seq`'s produced lists let its last query row read; nullopt for host lists or no selection.
  std::optional<int64_t> produced_tokens_read(int32_t seq) const;

  // `dense` narrowed to this selection; valid while both this selection and `dense`'s tables are. Produced lists
  // in one batch-wide layout are also described by the view's `produced`.
  AttentionView apply(const AttentionView& dense);

 private:
  SelectionUnit unit_ = SelectionUnit::kToken;
  int32_t num_seqs_ = 0;
  int32_t num_kv_heads_ = 0;
  int32_t num_selected_seqs_ = 0;
  struct ProducedLists {
    const int32_t* lists = nullptr;  // null: the sequence's lists are host lists (lists_)
    int32_t stride = 0;
    const int32_t* counts = nullptr;
    int64_t tokens_read = 0;
  };
  // Marks `seq` selected, counting it once.
  void mark_selected(int32_t seq);
  // The batch-wide layout of the produced lists when every sequence has them and they form one (sequence s at a
  // fixed stride from sequence 0, its counts num_kv_heads after the previous one's); else an empty one.
  ProducedSelection uniform_layout() const;

  std::vector<std::vector<int32_t>> lists_;  // [num_seqs][num_kv_heads]
  std::vector<ProducedLists> produced_;      // [num_seqs]
  std::vector<uint8_t> is_selected_;         // [num_seqs]
  std::vector<int32_t> flat_;                // per selected sequence: [num_kv_heads][stride] indices
  std::vector<int32_t> counts_;              // per selected sequence: [num_kv_heads]
  std::vector<SeqKvView> seqs_;              // the applied view's sequences
};

}  // namespace se
