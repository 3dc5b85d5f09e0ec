#include "sparse/methods/quest.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "backend/step_graph.h"
#include "base/check.h"
#include "sparse/group_reduce.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> QuestMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("quest", config));
  // Tokens attention reads per decode step; / page_size = the page budget, last page included (Quest's E2E
  // path). 2048 is the budget of the benchmark; Quest evaluates 512 .. 4096.
  SE_ASSIGN_OR_RETURN(int token_budget, reader.get_int("token_budget", 2048, 1, 1 << 30));
  // Leading layers that always attend densely (Quest skips the first two).
  SE_ASSIGN_OR_RETURN(int dense_layers, reader.get_int("dense_layers", 2, 0, 1 << 20));
  // How each KV head reduces its query group's page bounds.
  SE_ASSIGN_OR_RETURN(std::string gqa_agg, reader.get_choice("gqa_agg", "mean", {"mean", "max", "sum"}));
  // Spin's two-level ranking, under --kv-partitions only: pages per group summary (0: flat per-page bounds), and the
  // groups whose pages a step ranks.
  // The kept groups are read (and resolved) only with groups, so flat Quest's printed defaults take it back as given.
  SE_ASSIGN_OR_RETURN(int two_level_group, reader.get_int("two_level_group", 0, 0, 1 << 20));
  std::optional<TwoLevelConfig> two_level;
  if (two_level_group > 0) {
    SE_ASSIGN_OR_RETURN(int kept_groups,
                        reader.get_int("two_level_kept_groups", TwoLevelConfig{}.num_groups_kept, 1, 1 << 20));
    two_level = TwoLevelConfig{.group_size = two_level_group, .num_groups_kept = kept_groups};
  } else if (config.is_object() && config.contains("two_level_kept_groups")) {
    return invalid_argument("quest: 'two_level_kept_groups' needs 'two_level_group' (pages per group, at least 1)");
  }
  SE_RETURN_IF_ERROR(reader.finish());
  const GroupReduce reduce = group_reduce_named(gqa_agg);
  return std::unique_ptr<MethodRuntime>(
      new QuestMethod(reader.resolved(), token_budget, dense_layers, reduce, two_level));
}

QuestMethod::QuestMethod(nlohmann::ordered_json config, int token_budget, int dense_layers, GroupReduce gqa_agg,
                         std::optional<TwoLevelConfig> two_level)
    : MethodRuntime("quest", std::move(config)),
      token_budget_(token_budget),
      dense_layers_(dense_layers),
      gqa_agg_(gqa_agg),
      two_level_(two_level) {
  traits_.family = MethodFamily::kDynamicSelection;
  traits_.selection_unit = SelectionUnit::kPage;
  traits_.keeps_full_history = true;
  traits_.ops = {OpId::kUpdatePageKeyBounds, OpId::kSelectPagesByKeyBounds, OpId::kPagedAttentionOverSelection};
  // The key-bound ranking runs as ops over the device tables, its lists in the batch-wide layout that attention
  // reads by value: a decode forward enqueues the same work every step.
  traits_.static_decode_forward = true;
  traits_.keys_through_logits = true;  // a page's score bounds q . k over its keys
  traits_.tensor_parallel = true;      // each KV head ranks its own pages
}

Result<std::unique_ptr<CacheManager>> QuestMethod::create_cache(const CacheSpec& spec) {
  SE_ASSIGN_OR_RETURN(std::unique_ptr<CacheManager> cache, MethodRuntime::create_cache(spec));
  if (spec.partitions) return cache;
  // NOTE: every page's bounds are recomputed when a token lands in it, before any score reads them, so the
  // tensor needs no initialization.
  bounds_ =
      Tensor::empty(key_bounds_dtype(spec.layout.dtype), {spec.num_pages, 2, spec.layout.head_dim}, spec.allocator);
  if (!bounds_.defined())
    return resource_exhausted("quest: no memory for the key bounds of {} pages ({} bytes each)", spec.num_pages,
                              page_metadata_bytes(spec.layout));
  page_lists_ = page_counts_ = Tensor();
  list_capacity_seqs_ = list_budget_ = ranking_capacity_pages_ = 0;
  StepGraph::note_buffers_moved();
  return cache;
}

int64_t QuestMethod::tokens_read(const SeqKvView& sv, int32_t num_kv_heads, int32_t page_size) const {
  const int32_t page_budget = std::max(1, token_budget_ / page_size);
  int64_t n = 0;
  for (int32_t h = 0; h < num_kv_heads; ++h) {
    const int32_t stored = sv.num_tokens[h];
    const int32_t num_pages = (stored + page_size - 1) / page_size;
    // Every selected page but the last is full.
    n += num_pages <= page_budget ? stored : (page_budget - 1) * page_size + stored - (num_pages - 1) * page_size;
  }
  return n;
}

void QuestMethod::reserve_ranking(Device device, int32_t num_seqs, int32_t num_kv_heads, int32_t page_budget,
                                  int32_t longest_stream_pages) {
  if (num_seqs > list_capacity_seqs_ || page_budget != list_budget_) {
    list_capacity_seqs_ = std::max(num_seqs, 2 * list_capacity_seqs_);
    list_budget_ = page_budget;
    page_lists_ = empty_on(device, DType::kI32, {list_capacity_seqs_, num_kv_heads, page_budget});
    page_counts_ = empty_on(device, DType::kI32, {list_capacity_seqs_, num_kv_heads});
    StepGraph::note_buffers_moved();
  }
  if (longest_stream_pages > ranking_capacity_pages_) {
    // An eighth of headroom, so a decoding batch changes the ranking's stride (and so its captured launches)
    // only every few thousand tokens.
    ranking_capacity_pages_ = (longest_stream_pages + longest_stream_pages / 8 + 255) / 256 * 256;
    StepGraph::note_buffers_moved();
  }
}

void QuestMethod::prepare_step(StepContext& ctx) {
  if (!bounds_.defined()) return;
  // Sized here, before the engine checks whether a captured decode step still fits its buffers: a replayed step
  // runs none of the hooks below. Logical lengths bound the streams (every token stays resident).
  const KvLayout& l = ctx.cache.layout();
  bool any_decode = false;
  int32_t longest = 0;
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    if (!slice.is_decode(ctx.batch.positions)) continue;
    any_decode = true;
    longest = std::max(longest, static_cast<int32_t>(l.pages_per_stream(ctx.cache.num_logical_tokens(slice.seq))));
  }
  if (!any_decode) return;  // nothing ranks this step
  reserve_ranking(bounds_.device(), static_cast<int32_t>(ctx.batch.sequences.size()), l.num_kv_heads,
                  std::max(1, token_budget_ / l.page_size), longest);
}

void QuestMethod::build_layer_selection(LayerContext& ctx, Selection& selection) {
  if (ctx.layer < dense_layers_) return;
  const AttentionView& view = ctx.view;
  int32_t max_new_tokens = 0;
  for (const SequenceSlice& slice : ctx.batch.sequences) max_new_tokens = std::max(max_new_tokens, slice.num_tokens);
  // Prefill and decode alike: the pages that took this step's tokens bound them, partial last pages included; over
  // KIVI the groups quantized since the sequence's last step (its window's keys are bounded as they are scored).
  if (is_kivi_view(view))
    update_kivi_group_bounds(ctx);
  else
    update_page_key_bounds(bounds_.view(), ctx.kernel_view, max_new_tokens);
  // A sliding-window layer already reads a bounded window; ranking pages it cannot see would only waste budget.
  if (ctx.params.sliding_window > 0) return;
  // The ranking's stride covers the decode sequences; prefill sequences of a mixed batch are ranked too (one op
  // for the batch) but their lists go unused, and the kernels clamp them to the stride.
  const int32_t page_size = selection_page_tokens(view);
  bool any_decode = false;
  int32_t longest = 0;
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    if (!ctx.batch.sequences[static_cast<size_t>(s)].is_decode(ctx.batch.positions)) continue;
    any_decode = true;
    for (int32_t h = 0; h < view.num_kv_heads; ++h)
      longest = std::max(longest, (view.seqs[s].num_tokens[h] + page_size - 1) / page_size);
  }
  if (!any_decode) return;  // prefill attends densely
  // Every decode sequence is ranked, also one whose streams fit the budget (its lists then hold all its pages),
  // so a decode step enqueues the same work whatever the sequences' lengths.
  const int32_t page_budget = std::max(1, token_budget_ / page_size);
  reserve_ranking(view.kv_device, view.num_seqs, view.num_kv_heads, page_budget, longest);
  TensorView lists = page_lists_.view();
  TensorView counts = page_counts_.view();
  lists.shape = {view.num_seqs, view.num_kv_heads, page_budget};
  counts.shape = {view.num_seqs, view.num_kv_heads};
  select_pages_by_key_bounds(lists, counts, ctx.q, bounds_.view(), ctx.kernel_view, page_budget,
                             ranking_capacity_pages_, gqa_agg_);
  const int64_t lists_per_seq = int64_t{view.num_kv_heads} * page_budget;
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    if (!ctx.batch.sequences[static_cast<size_t>(s)].is_decode(ctx.batch.positions)) continue;
    selection.set_produced(s, lists.ptr<int32_t>() + s * lists_per_seq, page_budget,
                           counts.ptr<int32_t>() + int64_t{s} * view.num_kv_heads,
                           tokens_read(view.seqs[s], view.num_kv_heads, page_size));
  }
}

void QuestMethod::update_kivi_group_bounds(const LayerContext& ctx) {
  const AttentionView& view = ctx.view;
  const auto heads = static_cast<size_t>(view.num_kv_heads);
  const size_t first_stream = static_cast<size_t>(ctx.layer) * heads;
  first_groups_.assign(static_cast<size_t>(view.num_seqs) * heads, 0);
  for (int32_t s = 0; s < view.num_seqs; ++s) {
    std::vector<int32_t>& bounded = bounded_groups_[ctx.batch.sequences[static_cast<size_t>(s)].seq];
    if (bounded.size() < first_stream + heads) bounded.resize(first_stream + heads, 0);
    for (size_t h = 0; h < heads; ++h) {
      first_groups_[static_cast<size_t>(s) * heads + h] = bounded[first_stream + h];
      bounded[first_stream + h] = view.quantized.kivi_seqs[s].num_quantized_keys[h] / view.quantized.group_size;
    }
  }
  update_key_group_bounds(bounds_.view(), view, first_groups_);
}

void QuestMethod::on_sequence_end(int32_t seq) { bounded_groups_.erase(seq); }

MethodRuntime::DecodeReads QuestMethod::decode_reads(int layer, int32_t sliding_window, const AttentionView& view,
                                                     int32_t slice) const {
  if (layer < dense_layers_ || sliding_window > 0) return {};
  const int32_t page_size = selection_page_tokens(view);
  int64_t pages = 0;
  for (int32_t h = 0; h < view.num_kv_heads; ++h) pages += (view.seqs[slice].num_tokens[h] + page_size - 1) / page_size;
  return {tokens_read(view.seqs[slice], view.num_kv_heads, page_size),
          pages * 2 * view.head_dim * static_cast<int64_t>(dtype_size(key_bounds_dtype(view.kv_dtype)))};
}

void QuestMethod::on_pages_rewritten(int layer, const AttentionView& view) {
  if (layer < dense_layers_ || !bounds_.defined()) return;
  int32_t max_new_tokens = 0;
  for (int32_t s = 0; s < view.num_seqs; ++s)
    max_new_tokens = std::max(max_new_tokens, view.q_indptr[s + 1] - view.q_indptr[s]);
  update_page_key_bounds(bounds_.view(), view, max_new_tokens);
}

}  // namespace se
