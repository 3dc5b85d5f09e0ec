#include "sparse/partitioned_decode.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "backend/device_memory.h"
#include "kv/pool_attention_view.h"

namespace se {

PartitionedDecode::PartitionedDecode(HostTier* tier, const KvLayout& layout, PartitionConfig config)
    : tier_(tier),
      layout_(layout),
      config_(std::move(config)),
      device_(tier->device_pool()->storage()->device()),
      device_pool_(tier->device_pool()) {
  pool_bounds_ = empty_on(device_, layout_.dtype, {device_pool_->num_total_pages(), 2, layout_.head_dim});
  lists_ = empty_on(device_, DType::kI32, {1, layout_.num_kv_heads, page_budget()});
  counts_ = empty_on(device_, DType::kI32, {1, layout_.num_kv_heads});
  host_lists_ = Tensor::empty(DType::kI32, {1, layout_.num_kv_heads, page_budget()});
  host_counts_ = Tensor::empty(DType::kI32, {1, layout_.num_kv_heads});
}

AttentionView PartitionedDecode::layer_view(const int32_t* rows, int32_t stride, const TieredPageTable& table,
                                            int32_t layer, int32_t num_rows) {
  const PageTableView device = table.device_view();
  seq_view_ = SeqKvView{};
  seq_view_.page_ids = rows + static_cast<int64_t>(layout_.stream(layer, 0)) * stride;
  seq_view_.stride = stride;
  seq_view_.num_tokens = device.num_tokens + layout_.stream(layer, 0);
  q_indptr_ = {0, num_rows};
  return pool_attention_view(layout_, *device_pool_->storage(), {&seq_view_, 1}, q_indptr_.data());
}

void PartitionedDecode::store_bounds(const Index& index, const TieredPageTable& table,
                                     std::span<const StreamPage> pages) {
  const size_t row_bytes = 2 * static_cast<size_t>(layout_.head_dim) * dtype_size(layout_.dtype);
  auto* from = static_cast<char*>(pool_bounds_.raw());
  auto* to = static_cast<char*>(index.bounds.raw());
  for (const StreamPage& page : pages)
    copy_rows_async(device_, to + static_cast<size_t>(page.stream * index.stride + page.page_idx) * row_bytes, 0,
                    from + static_cast<size_t>(table.device_page(page)) * row_bytes, 0, row_bytes, 1);
}

int32_t PartitionedDecode::stride_for(int32_t num_tokens) const {
  return static_cast<int32_t>(
      std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(1, layout_.pages_per_stream(num_tokens)))));
}

int64_t PartitionedDecode::index_bytes_at(int32_t stride) const {
  // A token selection keeps no page bounds: its index is one step's, a few ints per kept token.
  if (!keeps_bounds()) return 0;
  const int64_t row = 2 * int64_t{layout_.head_dim};
  // Under two_level only the group summaries stay where the pool lives; the fine bounds are on the host.
  if (config_.two_level)
    return int64_t{layout_.num_streams()} *
           ((stride + config_.two_level->group_size - 1) / config_.two_level->group_size) * row *
           static_cast<int64_t>(sizeof(float));
  return int64_t{layout_.num_streams()} * stride * row * static_cast<int64_t>(dtype_size(layout_.dtype));
}

void PartitionedDecode::grow(Index& index, int32_t stride) const {
  const int32_t num_streams = layout_.num_streams();
  const Shape shape{keeps_bounds() ? int64_t{num_streams} * stride : 0, 2, layout_.head_dim};
  Tensor bounds = config_.two_level ? Tensor::empty(DType::kF32, shape) : empty_on(device_, layout_.dtype, shape);
  const size_t row_bytes = 2 * static_cast<size_t>(layout_.head_dim) * dtype_size(bounds.dtype());
  if (index.stride > 0 && keeps_bounds())
    copy_rows_async(bounds.device(), bounds.raw(), static_cast<size_t>(stride) * row_bytes, index.bounds.raw(),
                    static_cast<size_t>(index.stride) * row_bytes, static_cast<size_t>(index.stride) * row_bytes,
                    static_cast<size_t>(num_streams));
  index.bounds = std::move(bounds);
  if (config_.two_level) {
    const auto row = 2 * static_cast<size_t>(layout_.head_dim);
    const auto old_groups = static_cast<size_t>(index.stride > 0 ? groups_per_stream(index) : 0);
    const int32_t old_stride = index.stride;
    index.stride = stride;
    const auto new_groups = static_cast<size_t>(groups_per_stream(index));
    index.stride = old_stride;
    std::vector<float> groups(static_cast<size_t>(num_streams) * new_groups * row);
    for (size_t s = 0; s < static_cast<size_t>(num_streams) && old_groups > 0; ++s)
      std::copy_n(index.groups.begin() + static_cast<std::ptrdiff_t>(s * old_groups * row), old_groups * row,
                  groups.begin() + static_cast<std::ptrdiff_t>(s * new_groups * row));
    index.groups = std::move(groups);
  }
  index.stride = stride;
  index.entries.resize(static_cast<size_t>(num_streams) * static_cast<size_t>(stride));
  for (size_t e = 0; e < index.entries.size(); ++e) index.entries[e] = static_cast<int32_t>(e);
}

Status PartitionedDecode::add(int32_t seq, int32_t max_num_tokens) {
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
  grow(index, stride_for(std::max(max_num_tokens, table.num_logical_tokens())));
  const int32_t num_streams = layout_.num_streams();
  // Index: every page's bounds, each stream's tokens all counted as new.
  int32_t longest = 0;
  std::vector<StreamPage> pages;
  for (int32_t s = 0; s < num_streams; ++s) {
    longest = std::max(longest, table.num_tokens(s));
    for (int32_t p = 0; p < table.num_pages(s); ++p) pages.push_back({s, p});
  }
  const PageTableView device = table.device_view();
  for (int32_t l = 0; l < layout_.num_layers && longest > 0 && keeps_bounds(); ++l)
    update_page_key_bounds(pool_bounds_.view(), layer_view(device.page_ids, device.stride, table, l, longest), longest);
  if (keeps_bounds()) store_bounds(index, table, pages);
  if (config_.two_level)
    for (int32_t s = 0; s < num_streams; ++s)
      for (int32_t p = 0; p < table.num_pages(s) - 1; p += config_.two_level->group_size)
        summarize_group(index, table, s, p);
  seqs_.emplace(seq, std::move(index));
  return Status::ok();
}

Result<PartitionedDecode::Index> PartitionedDecode::take(int32_t seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("partitioned decode: no sequence {}", seq);
  Index index = std::move(it->second);
  seqs_.erase(it);
  return index;
}

Status PartitionedDecode::put(int32_t seq, Index index) {
  if (!tier_->contains(seq)) return not_found("partitioned decode: the host tier holds no sequence {}", seq);
  if (seqs_.count(seq) != 0) return conflict("partitioned decode: sequence {} is already indexed", seq);
  if (!index.host_pages.empty())
    return failed_precondition("partitioned decode: the index of sequence {} is parked on the host", seq);
  seqs_.emplace(seq, std::move(index));
  return Status::ok();
}

int64_t PartitionedDecode::index_pages(const Index& index, size_t page_bytes) const {
  const auto bytes = static_cast<size_t>(index_bytes_at(index.stride));
  return static_cast<int64_t>((bytes + page_bytes - 1) / page_bytes);
}

namespace {
// Lays num_bytes over the host pages `pages` in order: copy(page, offset, n) for each page's share [offset, offset +
// n).
template <typename Copy>
void over_host_pages(const PageStorage& storage, std::span<const int32_t> pages, size_t num_bytes, Copy copy) {
  for (size_t done = 0, p = 0; done < num_bytes; done += storage.page_bytes(), ++p)
    copy(static_cast<char*>(storage.page(pages[p])), done, std::min(storage.page_bytes(), num_bytes - done));
}
}  // namespace

Status PartitionedDecode::offload_index(Index& index, BlockPool& host_pool) const {
  if (!index.host_pages.empty()) return failed_precondition("partitioned decode: the index is already parked");
  const PageStorage& storage = *host_pool.storage();
  const int64_t num_pages = index_pages(index, storage.page_bytes());
  if (num_pages > host_pool.num_free_pages())
    return resource_exhausted("partitioned decode: parking an index takes {} host pages, {} free", num_pages,
                              host_pool.num_free_pages());
  SE_ASSIGN_OR_RETURN(index.host_pages, host_pool.allocate(static_cast<int32_t>(num_pages)));
  // The bounds live where the pool does; the two-level summaries are host code's.
  const Device from = config_.two_level ? Device::kCpu : device_;
  const auto* bytes = config_.two_level ? reinterpret_cast<const char*>(index.groups.data())
                                        : static_cast<const char*>(index.bounds.raw());
  const auto num_bytes = static_cast<size_t>(index_bytes_at(index.stride));
  over_host_pages(storage, index.host_pages, num_bytes,
                  [&](char* page, size_t offset, size_t n) { copy_bytes(from, page, bytes + offset, n); });
  if (config_.two_level) {
    std::vector<float>().swap(index.groups);  // `= {}` would keep the vector's capacity
  } else if (keeps_bounds()) {
    index.bounds = Tensor();
  }
  return Status::ok();
}

Status PartitionedDecode::retrieve_index(Index& index, BlockPool& host_pool) const {
  if (index.host_pages.empty() && index_bytes_at(index.stride) > 0)
    return failed_precondition("partitioned decode: the index is not parked");
  const PageStorage& storage = *host_pool.storage();
  const auto num_bytes = static_cast<size_t>(index_bytes_at(index.stride));
  char* bytes = nullptr;
  if (config_.two_level) {
    index.groups.resize(num_bytes / sizeof(float));
    bytes = reinterpret_cast<char*>(index.groups.data());
  } else if (keeps_bounds()) {
    index.bounds =
        empty_on(device_, layout_.dtype, {int64_t{layout_.num_streams()} * index.stride, 2, layout_.head_dim});
    bytes = static_cast<char*>(index.bounds.raw());
  }
  const Device to = config_.two_level ? Device::kCpu : device_;
  over_host_pages(storage, index.host_pages, num_bytes,
                  [&](const char* page, size_t offset, size_t n) { copy_bytes(to, bytes + offset, page, n); });
  host_pool.release(index.host_pages);
  index.host_pages.clear();
  return Status::ok();
}

void PartitionedDecode::summarize_group(Index& index, const TieredPageTable& table, int32_t stream,
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

void PartitionedDecode::select(Index& index, const TieredPageTable& table, int32_t layer, TensorView q) {
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

int64_t PartitionedDecode::buffer_pages(int32_t seq) const {
  if (config_.buffer == PartitionBuffer::kFixed) return config_.fixed_buffer_pages;
  // Mandatory: what the step's selections read over every stream (a short stream reads all its pages).
  const TieredPageTable& table = tier_->table(seq);
  int64_t mandatory = 0;
  for (int32_t s = 0; s < layout_.num_streams(); ++s) mandatory += std::min(table.num_pages(s), page_budget());
  return config_.buffer_factor * mandatory;
}

Status PartitionedDecode::retrieve(int32_t seq, Index& index, std::span<const StreamPage> pages, int64_t buffer_pages) {
  if (pages.empty()) return Status::ok();
  const auto wanted = static_cast<int64_t>(pages.size());
  // The buffer is a target: its oldest pages go out as far as the host has room for them.
  const int64_t over = std::min(tier_->table(seq).num_device_pages() + wanted - buffer_pages,
                                int64_t{tier_->host_pool()->num_free_pages()});
  if (over > 0) {
    SE_ASSIGN_OR_RETURN(const int64_t offloaded, tier_->offload_oldest(seq, over));
    index.counts.num_offloaded_pages += offloaded;
  }
  // In pieces of what the two pools have free: making room for a piece fills host pages that the piece's retrieve
  // then frees, so a sequence whose pages fill both pools still swaps them in.
  for (size_t done = 0; done < pages.size();) {
    const int64_t num_free = int64_t{device_pool_->num_free_pages()} + tier_->host_pool()->num_free_pages();
    if (num_free == 0)
      return resource_exhausted("partitioned decode: both pools are full, sequence {} cannot bring its pages in", seq);
    const auto piece = static_cast<size_t>(std::min<int64_t>(num_free, static_cast<int64_t>(pages.size() - done)));
    if (device_pool_->num_free_pages() < static_cast<int64_t>(piece))
      SE_RETURN_IF_ERROR(tier_->make_room(static_cast<int64_t>(piece)).status());
    SE_RETURN_IF_ERROR(tier_->retrieve(seq, pages.subspan(done, piece)));
    done += piece;
  }
  index.counts.num_retrieved_pages += wanted;
  return Status::ok();
}

std::vector<StreamPage> PartitionedDecode::layer_pages(const TieredPageTable& table, int32_t layer) const {
  std::vector<StreamPage> pages;
  for (int32_t h = 0; h < layout_.num_kv_heads; ++h) {
    const int32_t s = layout_.stream(layer, h);
    for (int32_t p = 0; p < table.num_pages(s); ++p) pages.push_back({s, p});
  }
  return pages;
}

Status PartitionedDecode::begin_step(int32_t seq, int32_t num_tokens) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("partitioned decode: no sequence {}", seq);
  if (num_tokens < 1) return invalid_argument("partitioned decode: a step of {} tokens", num_tokens);
  Index& index = it->second;
  index.counts = {};
  const int32_t num_before = tier_->table(seq).num_logical_tokens();
  const int32_t stride = stride_for(num_before + num_tokens);
  tier_->advance();
  // Every stream holds every token: each takes the same new pages.
  const int64_t new_pages = layout_.pages_for_tokens(num_before + num_tokens) - layout_.pages_for_tokens(num_before);
  if (device_pool_->num_free_pages() < new_pages) SE_RETURN_IF_ERROR(tier_->make_room(new_pages).status());
  SE_RETURN_IF_ERROR(tier_->append(seq, num_tokens));
  if (stride > index.stride) grow(index, stride);
  index.step_tokens = num_tokens;
  return Status::ok();
}

void PartitionedDecode::filter_tokens(Index& index, const TieredPageTable& table, int32_t layer,
                                      const AttentionView& view, TensorView q) {
  const int32_t prompt = index.num_prefill_tokens;
  const int32_t num_kept = std::min(config_.token_filters->num_kept_tokens, prompt);
  index.keeps_whole_prompt = num_kept >= prompt;
  if (index.keeps_whole_prompt) return;
  // Every stream holds every token: the tail past the prompt is the same length in each.
  const int64_t width = num_kept + table.num_tokens(layout_.stream(layer, 0)) - prompt;
  if (!index.token_lists.defined() || index.token_lists.shape()[1] < width) {
    index.kept_tokens = empty_on(device_, DType::kI32, {num_kept});
    index.token_lists = empty_on(device_, DType::kI32, {layout_.num_kv_heads, std::max(2 * width, int64_t{64})});
    index.token_counts = empty_on(device_, DType::kI32, {layout_.num_kv_heads});
  }
  const TensorView last_row{q.data, q.dtype, Shape{q.shape[1], q.shape[2]}, q.device};
  const float scale = 1.0f / std::sqrt(static_cast<float>(layout_.head_dim));
  top_keys_by_logits_max_over_heads(index.kept_tokens.view(), last_row, view, 0, prompt, scale);
  token_lists_with_tail(index.token_lists.view(), index.token_counts.view(), index.kept_tokens.view(), view, 0, prompt);
}

void PartitionedDecode::set_method_tokens(Index& index, std::span<const std::span<const int32_t>> tokens) const {
  size_t width = 1;
  for (const std::span<const int32_t> head : tokens) width = std::max(width, head.size());
  if (!index.token_lists.defined() || index.token_lists.shape()[1] < static_cast<int64_t>(width)) {
    index.token_lists = empty_on(device_, DType::kI32, {layout_.num_kv_heads, static_cast<int64_t>(2 * width)});
    index.token_counts = empty_on(device_, DType::kI32, {layout_.num_kv_heads});
  }
  const auto stride = static_cast<size_t>(index.token_lists.shape()[1]);
  for (size_t h = 0; h < tokens.size(); ++h) {
    std::copy(tokens[h].begin(), tokens[h].end(), index.token_lists.data<int32_t>() + h * stride);
    index.token_counts.data<int32_t>()[h] = static_cast<int32_t>(tokens[h].size());
  }
}

Status PartitionedDecode::check_method_tokens(int32_t seq, int32_t layer,
                                              std::span<const std::span<const int32_t>> tokens) const {
  if (tokens.empty()) return Status::ok();
  if (!config_.method_tokens)
    return invalid_argument(
        "partitioned decode: sequence {} was given tokens, but its method does not select them itself", seq);
  if (static_cast<int32_t>(tokens.size()) != layout_.num_kv_heads)
    return invalid_argument("partitioned decode: layer {} of sequence {} got tokens for {} KV heads of {}", layer, seq,
                            tokens.size(), layout_.num_kv_heads);
  const TieredPageTable& table = tier_->table(seq);
  for (int32_t h = 0; h < layout_.num_kv_heads; ++h) {
    const std::span<const int32_t> head = tokens[static_cast<size_t>(h)];
    const int32_t num_tokens = table.num_tokens(layout_.stream(layer, h));
    for (size_t i = 0; i < head.size(); ++i)
      if (head[i] < 0 || head[i] >= num_tokens || (i > 0 && head[i] <= head[i - 1]))
        return invalid_argument(
            "partitioned decode: KV head {} of layer {} of sequence {}: token {} is not ascending within its {} tokens",
            h, layer, seq, head[i], num_tokens);
  }
  return Status::ok();
}

Status PartitionedDecode::attend_tokens(int32_t seq, Index& index, int32_t layer, TensorView q, TensorView out,
                                        const AttentionParams& params) {
  const TieredPageTable& table = tier_->table(seq);
  const auto width = static_cast<int32_t>(index.token_lists.shape()[1]);
  const int32_t* lists = index.token_lists.data<int32_t>();
  const int32_t* counts = index.token_counts.data<int32_t>();
  // The pages the tokens lie in (each list ascends, so a page's tokens are consecutive).
  std::vector<StreamPage> resident, missing;
  for (int32_t h = 0; h < layout_.num_kv_heads; ++h) {
    int32_t last = -1;
    for (int32_t i = 0; i < counts[h]; ++i) {
      const int32_t page_idx = lists[h * width + i] / layout_.page_size;
      if (page_idx == last) continue;
      last = page_idx;
      const StreamPage page{layout_.stream(layer, h), page_idx};
      (table.device_page(page) >= 0 ? resident : missing).push_back(page);
    }
    index.counts.num_read_tokens += counts[h];
  }
  SE_RETURN_IF_ERROR(tier_->touch(seq, resident));
  // The decode tail's pages come on top of the kept tokens': the buffer never sheds the layer's reads.
  const auto num_reads = static_cast<int64_t>(resident.size() + missing.size());
  SE_RETURN_IF_ERROR(retrieve(seq, index, missing, std::max(buffer_pages(seq), num_reads)));
  index.counts.num_selected_pages += num_reads;
  for (const std::vector<StreamPage>* pages : {&resident, &missing})
    for (const StreamPage& page : *pages)
      if (table.device_page(page) < 0)
        return resource_exhausted("partitioned decode: the device pool cannot hold layer {}'s selection", layer);
  const PageTableView device = table.device_view();
  AttentionView view = layer_view(device.page_ids, device.stride, table, layer, 1);
  seq_view_.selected = lists;
  seq_view_.selected_stride = width;
  seq_view_.num_selected = counts;
  view.selection_unit = SelectionUnit::kToken;
  view.has_selection = true;
  view.selected_rows_max = 1;
  paged_attention(out, q, view, params);
  return Status::ok();
}

Status PartitionedDecode::attend(int32_t seq, int32_t layer, TensorView q, TensorView k, TensorView v, TensorView out,
                                 const AttentionParams& params, PartitionStep step,
                                 std::span<const std::span<const int32_t>> tokens) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("partitioned decode: no sequence {}", seq);
  if (layer < 0 || layer >= layout_.num_layers)
    return invalid_argument("partitioned decode: no layer {} of {}", layer, layout_.num_layers);
  Index& index = it->second;
  const auto num_rows = static_cast<int32_t>(q.shape[0]);
  if (num_rows != index.step_tokens || k.shape[0] != num_rows)
    return invalid_argument("partitioned decode: layer {} of sequence {} got {} query rows for a step of {} tokens",
                            layer, seq, num_rows, index.step_tokens);
  const TieredPageTable& table = tier_->table(seq);
  const int32_t heads = layout_.num_kv_heads;
  if (step == PartitionStep::kDecode && num_rows != 1)
    return invalid_argument("partitioned decode: a decode step of sequence {} has {} tokens", seq, num_rows);
  if (step == PartitionStep::kPrefill && !tokens.empty())
    return invalid_argument("partitioned decode: a prefill chunk of sequence {} reads its layer whole, not tokens",
                            seq);
  SE_RETURN_IF_ERROR(check_method_tokens(seq, layer, tokens));
  if (step == PartitionStep::kPrefill) index.num_prefill_tokens = table.num_logical_tokens();
  const TokenFilters* filters = config_.token_filters ? &*config_.token_filters : nullptr;
  // Filter and dense layers read whole under token_filters, and so does a sparse layer whose filter kept it all; under
  // method_tokens, a layer the method selected no tokens of.
  const bool filtered = filters != nullptr && filters->sources[static_cast<size_t>(layer)] >= 0;
  const bool dense = step == PartitionStep::kPrefill || layer < config_.dense_layers || params.sliding_window > 0 ||
                     (filters != nullptr && (!filtered || index.keeps_whole_prompt)) ||
                     (config_.method_tokens && tokens.empty());
  // The pages taking the step's tokens, in the layer's streams.
  std::vector<StreamPage> written, resident, missing;
  for (int32_t h = 0; h < heads; ++h) {
    const int32_t s = layout_.stream(layer, h);
    for (int32_t p = (table.num_tokens(s) - num_rows) / layout_.page_size; p < table.num_pages(s); ++p)
      written.push_back({s, p});
  }
  // Made resident first (an earlier layer's Offload may have taken some; the resident ones are touched first, so
  // bringing the others back spares them): the written pages, or a dense layer's every page.
  const std::vector<StreamPage> reads = dense ? layer_pages(table, layer) : written;
  for (const StreamPage& page : reads) (table.device_page(page) >= 0 ? resident : missing).push_back(page);
  SE_RETURN_IF_ERROR(tier_->touch(seq, resident));
  SE_RETURN_IF_ERROR(retrieve(seq, index, missing, std::max(buffer_pages(seq), static_cast<int64_t>(reads.size()))));
  for (const StreamPage& page : reads)
    if (table.device_page(page) < 0)
      return resource_exhausted("partitioned decode: the device pool cannot hold layer {}'s pages", layer);
  PageTableView device = table.device_view();
  const AttentionView write_view = layer_view(device.page_ids, device.stride, table, layer, num_rows);
  write_kv(write_view, k, v);
  if (keeps_bounds()) {
    update_page_key_bounds(pool_bounds_.view(), write_view, num_rows);
    store_bounds(index, table, written);
  }
  // The candidates end before the last page: the groups from the one holding the page before the first written
  // (it may just have stopped being the last) to the one holding the new next-to-last page are refreshed.
  if (config_.two_level) {
    for (int32_t h = 0; h < heads; ++h) {
      const int32_t s = layout_.stream(layer, h);
      const int32_t first = std::max(0, (table.num_tokens(s) - num_rows) / layout_.page_size - 1);
      for (int32_t p = first; p < table.num_pages(s) - 1; ++p)
        if (p == first || p % config_.two_level->group_size == 0) summarize_group(index, table, s, p);
    }
  }
  if (dense) {
    index.counts.num_selected_pages += static_cast<int64_t>(reads.size());
    for (int32_t h = 0; h < heads; ++h) {
      const int32_t stored = table.num_tokens(layout_.stream(layer, h));
      index.counts.num_read_tokens += params.sliding_window > 0 ? std::min(stored, params.sliding_window) : stored;
    }
    paged_attention(out, q, write_view, params);
    if (filters != nullptr && step == PartitionStep::kDecode && filters->is_filter[static_cast<size_t>(layer)])
      filter_tokens(index, table, layer, write_view, q);
    return Status::ok();
  }
  if (filters != nullptr) {
    if (!index.token_lists.defined())
      return failed_precondition("partitioned decode: sparse layer {} of sequence {} runs before its filter layer",
                                 layer, seq);
    return attend_tokens(seq, index, layer, q, out, params);
  }
  if (config_.method_tokens) {
    set_method_tokens(index, tokens);
    return attend_tokens(seq, index, layer, q, out, params);
  }

  // Select: the key-bound ranking over the index (its page lists are the entries of the pages' places), or two-level.
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
  SE_RETURN_IF_ERROR(retrieve(seq, index, missing, buffer_pages(seq)));
  index.counts.num_selected_pages += static_cast<int64_t>(resident.size() + missing.size());
  for (const std::vector<StreamPage>* pages : {&resident, &missing})
    for (const StreamPage& page : *pages)
      index.counts.num_read_tokens +=
          std::min(layout_.page_size, table.num_tokens(page.stream) - page.page_idx * layout_.page_size);
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
