#include "sparse/quest_partitioned_decode.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "kv/pool_attention_view.h"

namespace se {

QuestPartitionedDecode::QuestPartitionedDecode(HostTier* tier, const KvLayout& layout, PartitionConfig config)
    : tier_(tier),
      layout_(layout),
      config_(config),
      device_(tier->device_pool()->storage()->device()),
      device_pool_(tier->device_pool()) {
  pool_bounds_ = empty_on(device_, layout_.dtype, {device_pool_->num_total_pages(), 2, layout_.head_dim});
  lists_ = empty_on(device_, DType::kI32, {1, layout_.num_kv_heads, page_budget()});
  counts_ = empty_on(device_, DType::kI32, {1, layout_.num_kv_heads});
  host_lists_ = Tensor::empty(DType::kI32, {1, layout_.num_kv_heads, page_budget()});
  host_counts_ = Tensor::empty(DType::kI32, {1, layout_.num_kv_heads});
}

AttentionView QuestPartitionedDecode::layer_view(const int32_t* rows, int32_t stride, const TieredPageTable& table,
                                                 int32_t layer, int32_t num_rows) {
  const PageTableView device = table.device_view();
  seq_view_ = SeqKvView{};
  seq_view_.page_ids = rows + static_cast<int64_t>(layout_.stream(layer, 0)) * stride;
  seq_view_.stride = stride;
  seq_view_.num_tokens = device.num_tokens + layout_.stream(layer, 0);
  q_indptr_ = {0, num_rows};
  return pool_attention_view(layout_, *device_pool_->storage(), {&seq_view_, 1}, q_indptr_.data());
}

void QuestPartitionedDecode::store_bounds(const Index& index, const TieredPageTable& table,
                                          std::span<const StreamPage> pages) {
  const size_t row_bytes = 2 * static_cast<size_t>(layout_.head_dim) * dtype_size(layout_.dtype);
  auto* from = static_cast<char*>(pool_bounds_.raw());
  auto* to = static_cast<char*>(index.bounds.raw());
  for (const StreamPage& page : pages)
    copy_rows_async(device_, to + static_cast<size_t>(page.stream * index.stride + page.page_idx) * row_bytes, 0,
                    from + static_cast<size_t>(table.device_page(page)) * row_bytes, 0, row_bytes, 1);
}

Status QuestPartitionedDecode::add(int32_t seq, int32_t max_num_tokens) {
  if (!tier_->contains(seq)) return not_found("partitioned decode: the host tier holds no sequence {}", seq);
  if (seqs_.count(seq) != 0) return conflict("partitioned decode: sequence {} is already indexed", seq);
  const TieredPageTable& table = tier_->table(seq);
  if (table.num_host_pages() > 0)
    return failed_precondition("partitioned decode: sequence {} has {} pages on the host; index it resident", seq,
                               table.num_host_pages());
  if (config_.buffer == PartitionBuffer::kFixed &&
      config_.fixed_buffer_pages < int64_t{layout_.num_kv_heads} * page_budget())
    return failed_precondition("partitioned decode: a fixed buffer of {} pages cannot hold one layer's {} selected",
                               config_.fixed_buffer_pages, int64_t{layout_.num_kv_heads} * page_budget());
  // The two-level ranking is host code over fp32 bounds.
  if (config_.two_level && (layout_.dtype != DType::kF32 || config_.two_level->group_size < 1))
    return unimplemented("partitioned decode: the two-level index takes fp32 pages and groups of at least one page");
  Index index;
  index.stride = static_cast<int32_t>(layout_.pages_per_stream(std::max(max_num_tokens, table.num_logical_tokens())));
  const int32_t num_streams = layout_.num_streams();
  const Shape bounds_shape{int64_t{num_streams} * index.stride, 2, layout_.head_dim};
  index.bounds =
      config_.two_level ? Tensor::empty(DType::kF32, bounds_shape) : empty_on(device_, layout_.dtype, bounds_shape);
  if (config_.two_level)
    index.groups.resize(static_cast<size_t>(num_streams) * static_cast<size_t>(groups_per_stream(index)) * 2 *
                        static_cast<size_t>(layout_.head_dim));
  index.entries.resize(static_cast<size_t>(num_streams) * static_cast<size_t>(index.stride));
  for (size_t e = 0; e < index.entries.size(); ++e) index.entries[e] = static_cast<int32_t>(e);
  // Index: every page's bounds, each stream's tokens all counted as new.
  int32_t longest = 0;
  std::vector<StreamPage> pages;
  for (int32_t s = 0; s < num_streams; ++s) {
    longest = std::max(longest, table.num_tokens(s));
    for (int32_t p = 0; p < table.num_pages(s); ++p) pages.push_back({s, p});
  }
  const PageTableView device = table.device_view();
  for (int32_t l = 0; l < layout_.num_layers && longest > 0; ++l)
    update_page_key_bounds(pool_bounds_.view(), layer_view(device.page_ids, device.stride, table, l, longest), longest);
  store_bounds(index, table, pages);
  if (config_.two_level)
    for (int32_t s = 0; s < num_streams; ++s)
      for (int32_t p = 0; p < table.num_pages(s) - 1; p += config_.two_level->group_size)
        summarize_group(index, table, s, p);
  seqs_.emplace(seq, std::move(index));
  return Status::ok();
}

void QuestPartitionedDecode::summarize_group(Index& index, const TieredPageTable& table, int32_t stream,
                                             int32_t page_idx) const {
  const int32_t group_size = config_.two_level->group_size;
  const int32_t group = page_idx / group_size, first = group * group_size;
  const auto row = 2 * static_cast<size_t>(layout_.head_dim);
  const float* fine = index.bounds.data<float>() + static_cast<size_t>(stream * index.stride + first) * row;
  float* coarse = index.groups.data() + static_cast<size_t>(stream * groups_per_stream(index) + group) * row;
  const int32_t num_pages = std::min(group_size, table.num_pages(stream) - 1 - first);
  summarize_page_groups({fine, static_cast<size_t>(num_pages) * row}, num_pages, layout_.head_dim, group_size,
                        {coarse, row});
}

void QuestPartitionedDecode::select(Index& index, const TieredPageTable& table, int32_t layer, TensorView q) {
  const int32_t budget = page_budget();
  if (!config_.two_level) {
    select_pages_by_key_bounds(lists_.view(), counts_.view(), q, index.bounds.view(),
                               layer_view(index.entries.data(), index.stride, table, layer, 1), budget, index.stride,
                               config_.gqa_agg);
    copy(host_lists_.view(), lists_.view());
    copy(host_counts_.view(), counts_.view());
    for (int32_t h = 0; h < layout_.num_kv_heads; ++h) {
      const int32_t num_pages = table.num_pages(layout_.stream(layer, h));
      if (num_pages > budget) index.counts.num_ranked_pages += num_pages - 1;  // a shorter stream is read whole
    }
    return;
  }
  const auto group_heads = static_cast<int32_t>(q.shape[1]) / layout_.num_kv_heads;
  const auto row = 2 * static_cast<size_t>(layout_.head_dim);
  const int32_t num_groups = groups_per_stream(index);
  for (int32_t h = 0; h < layout_.num_kv_heads; ++h) {
    const int32_t s = layout_.stream(layer, h);
    const size_t q_size = static_cast<size_t>(group_heads) * static_cast<size_t>(layout_.head_dim);
    const std::vector<int32_t> pages = select_pages_two_level(
        {q.ptr<float>() + static_cast<size_t>(h) * q_size, q_size}, group_heads,
        {index.groups.data() + static_cast<size_t>(s * num_groups) * row, static_cast<size_t>(num_groups) * row},
        {index.bounds.data<float>() + static_cast<size_t>(s * index.stride) * row,
         static_cast<size_t>(index.stride) * row},
        table.num_pages(s), layout_.head_dim, budget, config_.gqa_agg, *config_.two_level,
        &index.counts.num_ranked_pages);
    std::copy(pages.begin(), pages.end(), host_lists_.data<int32_t>() + static_cast<size_t>(h * budget));
    host_counts_.data<int32_t>()[h] = static_cast<int32_t>(pages.size());
  }
}

int64_t QuestPartitionedDecode::buffer_pages(int32_t seq) const {
  if (config_.buffer == PartitionBuffer::kFixed) return config_.fixed_buffer_pages;
  // Mandatory: what the step's selections read over every stream (a short stream reads all its pages).
  const TieredPageTable& table = tier_->table(seq);
  int64_t mandatory = 0;
  for (int32_t s = 0; s < layout_.num_streams(); ++s) mandatory += std::min(table.num_pages(s), page_budget());
  return config_.buffer_factor * mandatory;
}

Status QuestPartitionedDecode::retrieve(int32_t seq, Index& index, std::span<const StreamPage> pages) {
  if (pages.empty()) return Status::ok();
  const auto wanted = static_cast<int64_t>(pages.size());
  const int64_t over = tier_->table(seq).num_device_pages() + wanted - buffer_pages(seq);
  if (over > 0) {
    SE_ASSIGN_OR_RETURN(const int64_t offloaded, tier_->offload_oldest(seq, over));
    index.counts.num_offloaded_pages += offloaded;
  }
  if (device_pool_->num_free_pages() < wanted) SE_RETURN_IF_ERROR(tier_->make_room(wanted).status());
  SE_RETURN_IF_ERROR(tier_->retrieve(seq, pages));
  index.counts.num_retrieved_pages += wanted;
  return Status::ok();
}

Status QuestPartitionedDecode::begin_step(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("partitioned decode: no sequence {}", seq);
  Index& index = it->second;
  index.counts = {};
  const TieredPageTable& table = tier_->table(seq);
  for (int32_t s = 0; s < layout_.num_streams(); ++s) {
    if (layout_.pages_per_stream(table.num_tokens(s) + 1) > index.stride)
      return out_of_range("partitioned decode: sequence {} would pass the {} tokens its index holds", seq,
                          index.stride * layout_.page_size);
  }
  tier_->advance();
  Status appended = tier_->append(seq, 1);
  if (appended.code() == StatusCode::kResourceExhausted) {
    SE_RETURN_IF_ERROR(tier_->make_room(layout_.pages_for_tokens(1)).status());
    appended = tier_->append(seq, 1);
  }
  return appended;
}

Status QuestPartitionedDecode::attend(int32_t seq, int32_t layer, TensorView q, TensorView k, TensorView v,
                                      TensorView out, const AttentionParams& params) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("partitioned decode: no sequence {}", seq);
  if (layer < 0 || layer >= layout_.num_layers)
    return invalid_argument("partitioned decode: no layer {} of {}", layer, layout_.num_layers);
  Index& index = it->second;
  const TieredPageTable& table = tier_->table(seq);
  const int32_t heads = layout_.num_kv_heads;
  // The token's slots, in the layer's last pages: resident (an earlier layer's Offload may have taken some; the
  // resident ones are touched first, so bringing the others back spares them), then written and their bounds
  // refreshed.
  std::vector<StreamPage> last_pages, resident, missing;
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t s = layout_.stream(layer, h);
    last_pages.push_back({s, table.num_pages(s) - 1});
    (table.device_page(last_pages.back()) >= 0 ? resident : missing).push_back(last_pages.back());
  }
  SE_RETURN_IF_ERROR(tier_->touch(seq, resident));
  SE_RETURN_IF_ERROR(retrieve(seq, index, missing));
  PageTableView device = table.device_view();
  const AttentionView write_view = layer_view(device.page_ids, device.stride, table, layer, 1);
  write_kv(write_view, k, v);
  update_page_key_bounds(pool_bounds_.view(), write_view, 1);
  store_bounds(index, table, last_pages);
  // The candidates end before the last page: refreshing the group of the one before it takes in a page that just
  // stopped being the last.
  if (config_.two_level)
    for (const StreamPage& page : last_pages)
      if (page.page_idx > 0) summarize_group(index, table, page.stream, page.page_idx - 1);

  // Select: Quest's ranking over the index (its page lists are the entries of the pages' places), or two-level.
  const int32_t budget = page_budget();
  select(index, table, layer, q);
  const int32_t* lists = host_lists_.data<int32_t>();
  const int32_t* counts = host_counts_.data<int32_t>();

  // Retrieve what the selection lacks; the resident part is touched first, so an Offload spares it.
  resident.clear();
  missing.clear();
  for (int32_t h = 0; h < heads; ++h) {
    for (int32_t i = 0; i < counts[h]; ++i) {
      const StreamPage page{layout_.stream(layer, h), lists[h * budget + i]};
      (table.device_page(page) >= 0 ? resident : missing).push_back(page);
    }
  }
  SE_RETURN_IF_ERROR(tier_->touch(seq, resident));
  SE_RETURN_IF_ERROR(retrieve(seq, index, missing));
  index.counts.num_selected_pages += static_cast<int64_t>(resident.size() + missing.size());
  // Retrieving spares the selection (touched last, and no larger than the buffer) unless the device pool itself
  // is smaller than what the other sequences keep resident plus this selection.
  for (const std::vector<StreamPage>* pages : {&resident, &missing})
    for (const StreamPage& page : *pages)
      if (table.device_page(page) < 0)
        return resource_exhausted("partitioned decode: the device pool cannot hold layer {}'s selection", layer);

  // Attention over the selected pages through the device rows.
  device = table.device_view();
  AttentionView view = layer_view(device.page_ids, device.stride, table, layer, 1);
  seq_view_.selected = lists;
  seq_view_.selected_stride = budget;
  seq_view_.num_selected = counts;
  view.selection_unit = SelectionUnit::kPage;
  view.has_selection = true;
  view.selected_rows_max = 1;
  paged_attention(out, q, view, params);
  return Status::ok();
}

}  // namespace se
