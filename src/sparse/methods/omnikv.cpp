#include "sparse/methods/omnikv.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/device_memory.h"
#include "backend/ops.h"
#include "base/check.h"
#include "base/top_k.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> OmniKvMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("omnikv", config));
  // OmniKV's do_select_layers (its example config's "2,8,18"); layers the model lacks are dropped.
  SE_ASSIGN_OR_RETURN(std::vector<int> filter_layers, reader.get_int_list("filter_layers", {2, 8, 18}, 1 << 20));
  // Dense layers after each filter layer before its index is used (num_wait_load_layers; 1 in the example).
  SE_ASSIGN_OR_RETURN(int num_wait, reader.get_int("num_wait", 1, 0, 1 << 20));
  // Prompt tokens kept (num_of_selected_tokens as an int; 2048 as in the benchmark) ...
  SE_ASSIGN_OR_RETURN(int num_selected_tokens, reader.get_int("num_selected_tokens", 2048, 0, 1 << 30));
  // ... or, when > 0, this fraction of the prompt (num_of_selected_tokens as a float; 0.067 in the example).
  SE_ASSIGN_OR_RETURN(double selected_fraction, reader.get_double("selected_fraction", 0.0, 0.0, 1.0));
  SE_RETURN_IF_ERROR(reader.finish());
  if (config.is_object() && config.contains("num_selected_tokens") && config.contains("selected_fraction"))
    return invalid_argument("omnikv: give either 'num_selected_tokens' or 'selected_fraction', not both");
  return std::unique_ptr<MethodRuntime>(new OmniKvMethod(reader.resolved(), std::move(filter_layers), num_wait,
                                                         num_selected_tokens, selected_fraction));
}

OmniKvMethod::OmniKvMethod(nlohmann::ordered_json config, std::vector<int> filter_layers, int num_wait,
                           int num_selected_tokens, double selected_fraction)
    : MethodRuntime("omnikv", std::move(config)),
      filter_layers_(std::move(filter_layers)),
      num_wait_(num_wait),
      num_selected_tokens_(num_selected_tokens),
      selected_fraction_(selected_fraction) {
  traits_.family = MethodFamily::kDynamicSelection;
  traits_.keeps_full_history = true;
  traits_.ops = {OpId::kTopKeysByLogitsMaxOverHeads, OpId::kTokenListsWithTail, OpId::kPagedAttentionOverSelection};
  traits_.static_decode_forward = false;  // the filter layers' selections are built on the host every step
  traits_.tensor_parallel = true;         // the ranks join their filter scores (top_keys_over_every_rank)
}

OmniKvMethod::LayerPlan OmniKvMethod::plan_layers(int32_t num_layers) const {
  LayerPlan plan;
  plan.roles.assign(static_cast<size_t>(num_layers), LayerRole::kDense);
  plan.sources.assign(static_cast<size_t>(num_layers), -1);
  std::vector<int32_t> filters;
  for (int f : filter_layers_)
    if (f < num_layers) filters.push_back(f);
  std::sort(filters.begin(), filters.end());
  filters.erase(std::unique(filters.begin(), filters.end()), filters.end());
  if (filters.empty()) return plan;
  // The full layers: every layer before the first filter layer, the filter layers, and L as a sentinel.
  std::vector<int32_t> full(static_cast<size_t>(filters.front()));
  std::iota(full.begin(), full.end(), 0);
  full.insert(full.end(), filters.begin(), filters.end());
  full.push_back(num_layers);
  for (size_t i = 0; i + 1 < full.size(); ++i) {
    const int32_t l = full[i], r = full[i + 1];
    const int32_t first_sparse = static_cast<int32_t>(std::min<int64_t>(r, int64_t{l} + num_wait_ + 1));
    for (int32_t x = first_sparse; x < r; ++x) {
      plan.roles[static_cast<size_t>(x)] = LayerRole::kSparse;
      plan.sources[static_cast<size_t>(x)] = l;
    }
    // Only a filter layer can have sparse layers after it (a layer before F0 is followed by the next layer).
    if (first_sparse < r) plan.roles[static_cast<size_t>(l)] = LayerRole::kFilter;
  }
  return plan;
}

std::optional<PartitionConfig> OmniKvMethod::partition_config() const {
  if (selected_fraction_ > 0.0) return std::nullopt;
  PartitionConfig config;
  config.token_filters = TokenFilters{.is_filter = {}, .sources = {}, .num_kept_tokens = num_selected_tokens_};
  return config;
}

void OmniKvMethod::complete_partition_config(PartitionConfig& config, int32_t num_layers) const {
  const LayerPlan layers = plan_layers(num_layers);
  TokenFilters& filters = *config.token_filters;
  filters.sources = layers.sources;
  filters.is_filter.clear();
  for (LayerRole role : layers.roles) filters.is_filter.push_back(role == LayerRole::kFilter ? 1 : 0);
}

const OmniKvMethod::LayerPlan& OmniKvMethod::plan(int32_t num_layers) {
  if (plan_num_layers_ != num_layers) {
    plan_ = plan_layers(num_layers);
    plan_num_layers_ = num_layers;
  }
  return plan_;
}

int32_t OmniKvMethod::num_kept_tokens(int32_t prefill_len) const {
  const int64_t n = selected_fraction_ > 0.0 ? static_cast<int64_t>(selected_fraction_ * prefill_len)
                                             : int64_t{num_selected_tokens_};
  return static_cast<int32_t>(std::min<int64_t>(n, prefill_len));
}

void OmniKvMethod::select_tokens(LayerContext& ctx, int32_t slice, int32_t prefill_len, int32_t num_kept,
                                 TokenIndex& index) {
  const Device device = ctx.view.kv_device;
  const int32_t num_kv_heads = ctx.view.num_kv_heads;
  const SeqKvView& sv = ctx.view.seqs[slice];
  const int32_t longest = *std::max_element(sv.num_tokens, sv.num_tokens + num_kv_heads);
  const int64_t stride = num_kept + (longest - prefill_len);
  if (!index.tokens.defined() || index.tokens.numel() != num_kept || index.tokens.device() != device)
    index.tokens = empty_on(device, DType::kI32, {num_kept});
  const bool has_lists = index.lists.defined() && index.lists.device() == device;
  if (!has_lists || index.lists.shape()[1] < stride) {
    // Room for a few hundred decode steps, then twice that: a steady decode allocates nothing.
    const int64_t room = std::max(stride + kTailRoom, has_lists ? 2 * index.lists.shape()[1] : 0);
    index.lists = empty_on(device, DType::kI32, {num_kv_heads, room});
    index.counts = empty_on(device, DType::kI32, {num_kv_heads});
  }
  // The filter scores of the sequence's last query row against its prompt keys, ranked where the pool lives; the
  // sparse layers' lists (the index, then each head's decode tail) are built there too, so the step never waits.
  const int64_t head_dim = ctx.q.shape[2];
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  if (communicator().size() == 1)
    top_keys_by_logits_max_over_heads(index.tokens.view(), ctx.last_query_row(slice), ctx.view, slice, prefill_len,
                                      scale);
  else
    top_keys_over_every_rank(index.tokens.view(), ctx.last_query_row(slice), ctx.view, slice, prefill_len, scale);
  token_lists_with_tail(index.lists.view(), index.counts.view(), index.tokens.view(), ctx.view, slice, prefill_len);
  index.tokens_read = 0;
  for (int32_t h = 0; h < num_kv_heads; ++h) index.tokens_read += num_kept + (sv.num_tokens[h] - prefill_len);
}

void OmniKvMethod::top_keys_over_every_rank(TensorView out_tokens, TensorView q, const AttentionView& view,
                                            int32_t slice, int32_t num_keys, float scale) const {
  Communicator& ranks = communicator();
  std::vector<float> mine(static_cast<size_t>(num_keys));
  attention_logits_max_over_heads(TensorView{mine.data(), DType::kF32, {num_keys}, Device::kCpu}, q, view, slice,
                                  scale);
  std::vector<float> all(static_cast<size_t>(ranks.size()) * mine.size());
  ranks.all_gather(TensorView{all.data(), DType::kF32, {ranks.size(), num_keys}, Device::kCpu},
                   TensorView{mine.data(), DType::kF32, {num_keys}, Device::kCpu});
  for (size_t r = 1; r < static_cast<size_t>(ranks.size()); ++r)
    for (size_t j = 0; j < mine.size(); ++j) all[j] = std::max(all[j], all[r * mine.size() + j]);
  const std::vector<int32_t> top = top_k_ascending(all.data(), num_keys, static_cast<int32_t>(out_tokens.shape[0]));
  std::copy(top.begin(), top.end(), out_tokens.ptr<int32_t>());
}

void OmniKvMethod::build_decode_selection(LayerContext& ctx, int32_t slice, Selection& selection) {
  const LayerPlan& layers = plan(ctx.cache.layout().num_layers);
  const LayerRole role = layers.roles[static_cast<size_t>(ctx.layer)];
  if (role == LayerRole::kDense) return;
  const SequenceSlice& s = ctx.batch.sequences[static_cast<size_t>(slice)];
  const int32_t prefill_len = s.num_prefill_tokens;
  const int32_t num_kept = num_kept_tokens(prefill_len);
  if (num_kept >= prefill_len) return;  // the index would hold the whole prompt: dense
  const int32_t position = ctx.batch.positions[static_cast<size_t>(s.token_begin)];

  if (role == LayerRole::kFilter) {  // pick the index; the filter layer itself attends densely
    TokenIndex& index = indices_[s.seq];
    select_tokens(ctx, slice, prefill_len, num_kept, index);
    index.filter_layer = ctx.layer;
    index.position = position;
    return;
  }
  // A sliding-window layer already reads a bounded window; the prompt index would mostly point outside it.
  if (ctx.params.sliding_window > 0) return;
  const auto it = indices_.find(s.seq);
  SE_CHECK(it != indices_.end() && it->second.filter_layer == layers.sources[static_cast<size_t>(ctx.layer)] &&
               it->second.position == position,
           "omnikv: sparse layer {} of seq {} runs before its filter layer {} at position {}", ctx.layer, s.seq,
           layers.sources[static_cast<size_t>(ctx.layer)], position);
  // Every layer of the step holds the same tokens, so the filter layer's lists serve its whole segment.
  const TokenIndex& index = it->second;
  selection.set_produced(slice, index.lists.view().ptr<int32_t>(), static_cast<int32_t>(index.lists.shape()[1]),
                         index.counts.view().ptr<int32_t>(), index.tokens_read);
}

}  // namespace se
