#include "sparse/selection.h"

#include <algorithm>

#include "base/check.h"

namespace se {

void Selection::reset(int32_t num_seqs, int32_t num_kv_heads, SelectionUnit unit) {
  unit_ = unit;
  num_seqs_ = num_seqs;
  num_kv_heads_ = num_kv_heads;
  num_selected_seqs_ = 0;
  lists_.resize(static_cast<size_t>(num_seqs) * num_kv_heads);
  for (auto& list : lists_) list.clear();
  produced_.assign(static_cast<size_t>(num_seqs), ProducedLists{});
  is_selected_.assign(static_cast<size_t>(num_seqs), 0);
}

void Selection::mark_selected(int32_t seq) {
  if (!is_selected_[static_cast<size_t>(seq)]) {
    is_selected_[static_cast<size_t>(seq)] = 1;
    ++num_selected_seqs_;
  }
}

void Selection::set(int32_t seq, int32_t kv_head, std::span<const int32_t> indices) {
  SE_CHECK(seq >= 0 && seq < num_seqs_ && kv_head >= 0 && kv_head < num_kv_heads_, "selection of seq {} head {}",
           seq, kv_head);
  SE_CHECK(std::is_sorted(indices.begin(), indices.end()), "selected indices must ascend");
  SE_CHECK(produced_[static_cast<size_t>(seq)].lists == nullptr, "selection of seq {}: host and produced lists",
           seq);
  lists_[static_cast<size_t>(seq) * num_kv_heads_ + kv_head].assign(indices.begin(), indices.end());
  mark_selected(seq);
}

void Selection::set_produced(int32_t seq, const int32_t* lists, int32_t stride, const int32_t* counts,
                             int64_t tokens_read) {
  SE_CHECK(seq >= 0 && seq < num_seqs_ && lists != nullptr && counts != nullptr, "produced selection of seq {}",
           seq);
  produced_[static_cast<size_t>(seq)] = {lists, stride, counts, tokens_read};
  mark_selected(seq);
}

std::optional<std::span<const int32_t>> Selection::get(int32_t seq, int32_t kv_head) const {
  if (!is_selected_[static_cast<size_t>(seq)]) return std::nullopt;
  const ProducedLists& produced = produced_[static_cast<size_t>(seq)];
  if (produced.lists != nullptr)
    return std::span<const int32_t>(produced.lists + static_cast<int64_t>(kv_head) * produced.stride,
                                    static_cast<size_t>(produced.counts[kv_head]));
  return std::span<const int32_t>(lists_[static_cast<size_t>(seq) * num_kv_heads_ + kv_head]);
}

std::optional<int64_t> Selection::produced_tokens_read(int32_t seq) const {
  const ProducedLists& produced = produced_[static_cast<size_t>(seq)];
  if (produced.lists == nullptr) return std::nullopt;
  return produced.tokens_read;
}

ProducedSelection Selection::uniform_layout() const {
  if (num_selected_seqs_ != num_seqs_) return {};
  const ProducedLists& first = produced_.front();
  const int64_t seq_stride = num_seqs_ > 1 ? produced_[1].lists - first.lists : 0;
  for (int32_t s = 0; s < num_seqs_; ++s) {
    const ProducedLists& p = produced_[static_cast<size_t>(s)];
    if (p.stride != first.stride || p.lists != first.lists + s * seq_stride ||
        p.counts != first.counts + int64_t{s} * num_kv_heads_)
      return {};
  }
  return ProducedSelection{first.lists, seq_stride, first.stride, first.counts};
}

AttentionView Selection::apply(const AttentionView& dense) {
  SE_CHECK(dense.num_seqs == num_seqs_ && dense.num_kv_heads == num_kv_heads_, "selection for another batch");
  AttentionView view = dense;
  if (empty()) return view;
  // Lay every selected sequence out as [num_kv_heads][stride] first, then point the views into the buffers.
  std::vector<int32_t> strides(static_cast<size_t>(num_seqs_), 0);
  size_t flat_size = 0;
  for (int32_t s = 0; s < num_seqs_; ++s) {
    if (!is_selected_[static_cast<size_t>(s)] || produced_[static_cast<size_t>(s)].lists != nullptr) continue;
    int32_t stride = 0;
    for (int32_t h = 0; h < num_kv_heads_; ++h)
      stride = std::max(stride, static_cast<int32_t>(lists_[static_cast<size_t>(s) * num_kv_heads_ + h].size()));
    strides[static_cast<size_t>(s)] = stride;
    flat_size += static_cast<size_t>(stride) * num_kv_heads_;
  }
  // At least one element: a selected sequence whose lists are all empty must still point somewhere, since a null
  // list means every token.
  flat_.assign(std::max<size_t>(flat_size, 1), 0);
  counts_.assign(static_cast<size_t>(num_selected_seqs_) * num_kv_heads_, 0);
  seqs_.assign(dense.seqs, dense.seqs + num_seqs_);
  size_t flat_at = 0, count_at = 0;
  for (int32_t s = 0; s < num_seqs_; ++s) {
    if (!is_selected_[static_cast<size_t>(s)]) continue;
    SeqKvView& sv = seqs_[static_cast<size_t>(s)];
    const ProducedLists& produced = produced_[static_cast<size_t>(s)];
    if (produced.lists != nullptr) {
      sv.selected = produced.lists;
      sv.selected_stride = produced.stride;
      sv.num_selected = produced.counts;
      view.selection_produced = true;
      continue;
    }
    const int32_t stride = strides[static_cast<size_t>(s)];
    sv.selected = flat_.data() + flat_at;
    sv.selected_stride = stride;
    sv.num_selected = counts_.data() + count_at;
    for (int32_t h = 0; h < num_kv_heads_; ++h) {
      const auto& list = lists_[static_cast<size_t>(s) * num_kv_heads_ + h];
      std::copy(list.begin(), list.end(), flat_.begin() + static_cast<ptrdiff_t>(flat_at + static_cast<size_t>(h) * stride));
      counts_[count_at + static_cast<size_t>(h)] = static_cast<int32_t>(list.size());
    }
    flat_at += static_cast<size_t>(stride) * num_kv_heads_;
    count_at += static_cast<size_t>(num_kv_heads_);
  }
  SE_CHECK(!view.selection_produced || flat_at == 0, "a selection mixes host and produced lists in one batch");
  if (dense.q_indptr != nullptr) {
    view.selected_rows_max = 0;
    for (int32_t s = 0; s < num_seqs_; ++s)
      if (is_selected_[static_cast<size_t>(s)])
        view.selected_rows_max = std::max(view.selected_rows_max, dense.q_indptr[s + 1] - dense.q_indptr[s]);
  }
  if (view.selection_produced) view.produced = uniform_layout();
  view.seqs = seqs_.data();
  view.selection_unit = unit_;
  view.has_selection = true;
  return view;
}

}  // namespace se
