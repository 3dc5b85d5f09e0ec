#include "sparse/methods/quest.h"

#include <algorithm>
#include <numeric>

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
  head_scores_ = Tensor();
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
  const int32_t page_budget = std::max(1, token_budget_ / view.page_size);
  int32_t max_pages = 0;
  for (int32_t h = 0; h < view.num_kv_heads; ++h)
    max_pages = std::max(max_pages, (sv.num_tokens[h] + view.page_size - 1) / view.page_size);
  if (max_pages <= page_budget) return;  // every stream fits the budget: dense

  // Upper bounds of the sequence's last query row against every page: [num_heads, max_pages].
  const int64_t num_heads = ctx.q.shape[1];
  const TensorView q_row = ctx.last_query_row(slice);
  if (!head_scores_.defined() || head_scores_.numel() < num_heads * max_pages)
    head_scores_ = Tensor::empty(DType::kF32, {num_heads * max_pages});
  TensorView scores{head_scores_.raw(), DType::kF32, Shape{num_heads, max_pages}, head_scores_.device()};
  page_key_bound_scores(scores, q_row, bounds_.view(), view, slice);

  const int64_t group = num_heads / view.num_kv_heads;
  const float* head_score = scores.ptr<float>();
  for (int32_t h = 0; h < view.num_kv_heads; ++h) {
    const int32_t num_pages = (sv.num_tokens[h] + view.page_size - 1) / view.page_size;
    order_.resize(static_cast<size_t>(num_pages));
    std::iota(order_.begin(), order_.end(), 0);
    if (num_pages > page_budget) {
      // Reduce the group's bounds of every page but the last, then keep the best (budget - 1) and the last.
      const int32_t num_candidates = num_pages - 1;
      group_scores_.assign(static_cast<size_t>(num_candidates), 0.0f);
      for (int32_t p = 0; p < num_candidates; ++p) {
        float acc = head_score[h * group * max_pages + p];
        for (int64_t g = 1; g < group; ++g) {
          const float v = head_score[(h * group + g) * max_pages + p];
          acc = gqa_agg_ == GroupReduce::kMax ? std::max(acc, v) : acc + v;
        }
        group_scores_[static_cast<size_t>(p)] = gqa_agg_ == GroupReduce::kMean ? acc / static_cast<float>(group) : acc;
      }
      const auto better = [this](int32_t a, int32_t b) {
        const float sa = group_scores_[static_cast<size_t>(a)], sb = group_scores_[static_cast<size_t>(b)];
        return sa > sb || (sa == sb && a < b);
      };
      const auto keep_end = order_.begin() + (page_budget - 1);
      std::nth_element(order_.begin(), keep_end, order_.begin() + num_candidates, better);
      *keep_end = num_pages - 1;
      order_.resize(static_cast<size_t>(page_budget));
      std::sort(order_.begin(), order_.end());
    }
    selection.set(slice, h, order_);
  }
}

void QuestMethod::on_pages_rewritten(int layer, const AttentionView& view) {
  if (layer >= dense_layers_ && bounds_.defined()) update_page_key_bounds(bounds_.view(), view);
}

}  // namespace se
