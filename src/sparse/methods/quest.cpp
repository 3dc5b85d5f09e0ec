#include "sparse/methods/quest.h"

#include <algorithm>

#include "backend/device_memory.h"
#include "base/check.h"

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
  SE_RETURN_IF_ERROR(reader.finish());
  const GroupReduce reduce = gqa_agg == "max"   ? GroupReduce::kMax
                             : gqa_agg == "sum" ? GroupReduce::kSum
                                                : GroupReduce::kMean;
  return std::unique_ptr<MethodRuntime>(new QuestMethod(reader.resolved(), token_budget, dense_layers, reduce));
}

QuestMethod::QuestMethod(nlohmann::ordered_json config, int token_budget, int dense_layers, GroupReduce gqa_agg)
    : config_(std::move(config)), token_budget_(token_budget), dense_layers_(dense_layers), gqa_agg_(gqa_agg) {
  traits_.family = MethodFamily::kDynamicSelection;
  traits_.keeps_full_history = true;
  traits_.score_needs = ScoreNeeds::kQueryKeyBounds;
}

Result<std::unique_ptr<CacheManager>> QuestMethod::create_cache(const CacheSpec& spec) {
  SE_ASSIGN_OR_RETURN(std::unique_ptr<CacheManager> cache, MethodRuntime::create_cache(spec));
  // NOTE: every page's bounds are recomputed when a token lands in it, before any score reads them, so the
  // tensor needs no initialization.
  bounds_ = Tensor::empty(DType::kF32, {spec.num_pages, 2, spec.layout.head_dim}, spec.allocator);
  if (!bounds_.defined())
    return resource_exhausted("quest: no memory for the key bounds of {} pages ({} bytes each)", spec.num_pages,
                              page_metadata_bytes(spec.layout));
  page_lists_ = page_counts_ = Tensor();
  return cache;
}

void QuestMethod::refresh_bounds(const LayerContext& ctx, int32_t slice) {
  SE_CHECK(bounds_.defined(), "quest: its page bounds come with the cache its create_cache builds");
  // The one-sequence view of `slice`: its SeqKvView and its two q_indptr entries (only their difference is read).
  AttentionView one = ctx.view;
  one.seqs = ctx.view.seqs + slice;
  one.q_indptr = ctx.view.q_indptr + slice;
  one.num_seqs = 1;
  update_page_key_bounds(bounds_.view(), one);
}

void QuestMethod::build_prefill_selection(LayerContext& ctx, int32_t slice, Selection& /*selection*/) {
  // Prefill attends densely; the bounds of the prompt's pages are kept for the decode steps.
  if (ctx.layer >= dense_layers_) refresh_bounds(ctx, slice);
}

void QuestMethod::build_decode_selection(LayerContext& ctx, int32_t slice, Selection& selection) {
  if (ctx.layer < dense_layers_) return;
  refresh_bounds(ctx, slice);  // the last page now bounds the new token too
  // A sliding-window layer already reads a bounded window; ranking pages it cannot see would only waste budget.
  if (ctx.params.sliding_window > 0) return;
  const AttentionView& view = ctx.view;
  const SeqKvView& sv = view.seqs[slice];
  const int32_t page_size = view.page_size;
  const int32_t page_budget = std::max(1, token_budget_ / page_size);
  int32_t max_pages = 0;
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    max_pages = std::max(max_pages, (sv.num_tokens[h] + page_size - 1) / page_size);
  if (max_pages <= page_budget) return;  // every stream fits the budget: dense

  const int64_t lists_per_seq = int64_t{view.num_kv_heads} * page_budget;
  if (!page_lists_.defined() || page_lists_.numel() < view.num_seqs * lists_per_seq) {
    page_lists_ = empty_on(view.kv_device, DType::kI32, {view.num_seqs * lists_per_seq});
    page_counts_ = empty_on(view.kv_device, DType::kI32, {int64_t{view.num_seqs} * view.num_kv_heads});
  }
  TensorView lists{page_lists_.data<int32_t>() + slice * lists_per_seq, DType::kI32,
                   Shape{view.num_kv_heads, page_budget}, view.kv_device};
  TensorView counts{page_counts_.data<int32_t>() + int64_t{slice} * view.num_kv_heads, DType::kI32,
                    Shape{view.num_kv_heads}, view.kv_device};
  select_pages_by_key_bounds(lists, counts, ctx.last_query_row(slice), bounds_.view(), view, slice, page_budget,
                             gqa_agg_);
  // Every selected page but the last is full.
  int64_t tokens_read = 0;
  for (int32_t h = 0; h < view.num_kv_heads; ++h) {
    const int32_t stored = sv.num_tokens[h];
    const int32_t num_pages = (stored + page_size - 1) / page_size;
    tokens_read += num_pages <= page_budget ? stored : (page_budget - 1) * page_size + stored - (num_pages - 1) * page_size;
  }
  selection.set_produced(slice, lists.ptr<int32_t>(), page_budget, counts.ptr<int32_t>(), tokens_read);
}

void QuestMethod::on_pages_rewritten(int layer, const AttentionView& view) {
  if (layer >= dense_layers_ && bounds_.defined()) update_page_key_bounds(bounds_.view(), view);
}

}  // namespace se
