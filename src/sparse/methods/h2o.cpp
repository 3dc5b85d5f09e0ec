#include "sparse/methods/h2o.h"

#include <algorithm>
#include <numeric>

#include "backend/device_memory.h"
#include "base/check.h"
#include "base/top_k.h"
#include "sparse/kivi_cache_manager.h"

namespace se {

Result<std::unique_ptr<MethodRuntime>> H2oMethod::create(const nlohmann::json& config) {
  SE_ASSIGN_OR_RETURN(MethodConfig reader, MethodConfig::parse("h2o", config));
  SE_ASSIGN_OR_RETURN(const int budget, reader.get_int("budget", 2048, 1, 1 << 30));
  SE_ASSIGN_OR_RETURN(const double heavy_ratio, reader.get_double("heavy_ratio", 0.5, 0.0, 1.0));
  SE_ASSIGN_OR_RETURN(int heavy, reader.get_int("heavy", -1, -1, 1 << 29));
  SE_ASSIGN_OR_RETURN(int recent, reader.get_int("recent", -1, -1, 1 << 29));
  SE_ASSIGN_OR_RETURN(const std::string agg, reader.get_choice("gqa_agg", "mean", {"mean", "max", "sum"}));
  SE_RETURN_IF_ERROR(reader.finish());
  // -1 = derived. An explicit heavy/recent replaces the ratio; both explicit replace the budget.
  const bool explicit_split = heavy >= 0 || recent >= 0;
  if (explicit_split && config.contains("heavy_ratio"))
    return invalid_argument("h2o: give either 'heavy_ratio' or 'heavy'/'recent', not both");
  if (heavy >= 0 && recent >= 0) {
    if (config.contains("budget") && budget != heavy + recent)
      return invalid_argument("h2o: 'budget' = {} differs from 'heavy' + 'recent' = {}", budget, heavy + recent);
  } else if (heavy >= 0 || recent >= 0) {
    int& derived = heavy >= 0 ? recent : heavy;
    derived = budget - std::max(heavy, recent);
    if (derived < 0)
      return invalid_argument("h2o: 'heavy'/'recent' = {} exceeds 'budget' = {}", std::max(heavy, recent), budget);
  } else {
    heavy = static_cast<int>(budget * heavy_ratio);
    recent = budget - heavy;
  }
  if (heavy + recent < 1) return invalid_argument("h2o: 'heavy' + 'recent' must keep at least one token");
  nlohmann::ordered_json resolved = reader.resolved();
  resolved["budget"] = heavy + recent;
  resolved["heavy"] = heavy;
  resolved["recent"] = recent;
  const GroupReduce gqa_agg = group_reduce_named(agg);
  return std::unique_ptr<MethodRuntime>(new H2oMethod(std::move(resolved), heavy, recent, gqa_agg));
}

H2oMethod::H2oMethod(nlohmann::ordered_json config, int32_t num_heavy, int32_t num_recent, GroupReduce gqa_agg)
    : MethodRuntime("h2o", std::move(config)), num_heavy_(num_heavy), num_recent_(num_recent), gqa_agg_(gqa_agg) {
  traits_.family = MethodFamily::kEviction;
  traits_.keeps_full_history = false;
  traits_.ops = {OpId::kAttentionScores, OpId::kCompactKv, OpId::kMoveKvRows};
  traits_.static_decode_forward = false;  // the column sums accumulate in every decode step's forward
  traits_.prefix_mode = PrefixMode::kChain;
  traits_.prefill_policy = PrefillPolicy::kEvictDuring;
  traits_.tensor_parallel = true;  // each stream accumulates and evicts by its own scores
  traits_.evicts_sealed_groups = true;
}

int64_t H2oMethod::resident_pages(const KvLayout& layout, int32_t /*num_prefill_tokens*/, int32_t num_tokens) const {
  if (layout.kivi())
    return KiviCacheManager::sealed_group_eviction_pages(layout, num_tokens, max_kept_in_groups(layout));
  return budget_resident_pages(layout, num_tokens, num_heavy_ + num_recent_);
}

int32_t H2oMethod::max_kept_in_groups(const KvLayout& layout) const {
  // A stream stops dropping under budget + G tokens, or once no sealed group lies before its recent tokens: then it
  // holds its recent tokens or its unsealed tokens (under the window plus a group), and the rest of one group.
  return std::max(num_heavy_ + num_recent_, layout.kivi_residual) + layout.page_size - 1;
}

void H2oMethod::choose_lowest_groups(std::span<const float> acc, int32_t group_size, int32_t num_candidates,
                                     int32_t num_dropped) {
  group_scores_.assign(static_cast<size_t>(num_candidates), 0.0f);
  for (int32_t g = 0; g < num_candidates; ++g)
    for (int32_t j = g * group_size; j < (g + 1) * group_size; ++j)
      group_scores_[static_cast<size_t>(g)] += acc[static_cast<size_t>(j)];
  dropped_groups_.resize(static_cast<size_t>(num_candidates));
  std::iota(dropped_groups_.begin(), dropped_groups_.end(), 0);
  // Ties drop the newer group, as a tie between tokens keeps the older one.
  std::partial_sort(
      dropped_groups_.begin(), dropped_groups_.begin() + num_dropped, dropped_groups_.end(), [&](int32_t a, int32_t b) {
        const float sa = group_scores_[static_cast<size_t>(a)], sb = group_scores_[static_cast<size_t>(b)];
        return sa < sb || (sa == sb && a > b);
      });
  dropped_groups_.resize(static_cast<size_t>(num_dropped));
  std::sort(dropped_groups_.begin(), dropped_groups_.end());
}

void H2oMethod::drop_lowest_groups(StepContext& ctx, const SequenceSlice& slice, int32_t group_size,
                                   SequenceScores& scores) {
  const KvLayout& layout = ctx.cache.layout();
  const int32_t budget = num_heavy_ + num_recent_;
  scratch_.kept.resize(static_cast<size_t>(layout.num_streams()));
  scratch_.evictions.clear();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    // A sliding-window layer keeps the tail it can see (sliding_window_tail.h): every older sealed group goes.
    const int32_t window = ctx.sliding_window(layer);
    const int32_t recent = window > 0 ? std::min(budget, window - 1) : num_recent_;
    for (int head = 0; head < layout.num_kv_heads; ++head) {
      const int32_t len = ctx.cache.stream_length(slice.seq, layer, head);
      if (len < budget + group_size) continue;
      // The candidates: the stream's first groups, sealed and older than its recent tokens.
      const int32_t num_candidates =
          std::min(ctx.cache.sealed_groups(slice.seq, layer, head).count, (len - recent) / group_size);
      const int32_t num_dropped = window > 0 ? num_candidates : std::min(num_candidates, (len - budget) / group_size);
      if (num_dropped <= 0) continue;
      const auto stream = static_cast<size_t>(layout.stream(layer, head));
      const std::vector<float>& acc = scores.acc[stream];
      SE_CHECK(acc.size() == static_cast<size_t>(len), "h2o: acc out of step with stream");
      if (window > 0) {
        dropped_groups_.resize(static_cast<size_t>(num_dropped));
        std::iota(dropped_groups_.begin(), dropped_groups_.end(), 0);
      } else {
        choose_lowest_groups(acc, group_size, num_candidates, num_dropped);
      }
      const std::span<const int32_t> positions = ctx.cache.slot_positions(slice.seq, layer, head);
      std::vector<int32_t>& kept = scratch_.kept[stream];
      kept.clear();
      auto next_dropped = dropped_groups_.begin();
      for (int32_t j = 0; j < len; ++j) {
        if (next_dropped != dropped_groups_.end() && j == (*next_dropped + 1) * group_size) ++next_dropped;
        if (next_dropped != dropped_groups_.end() && j >= *next_dropped * group_size) {
          if (window == 0)
            scores.dropped[stream].push_back({positions[static_cast<size_t>(j)], acc[static_cast<size_t>(j)]});
        } else {
          kept.push_back(j);
        }
      }
      scratch_.evictions.push_back({layer, head, kept});
    }
  }
  if (scratch_.evictions.empty()) return;
  const Status dropped = ctx.cache.evict_streams(slice.seq, scratch_.evictions);
  SE_CHECK(dropped.is_ok(), "h2o: {}", dropped.to_string());
  for (const KvStreams::StreamEviction& e : scratch_.evictions)
    keep_scores(scores.acc[static_cast<size_t>(layout.stream(e.layer, e.kv_head))], e.kept);
}

void H2oMethod::plan_step_scores(const LayerContext& ctx, int64_t num_heads) {
  const KvLayout& layout = ctx.cache.layout();
  const auto num_seqs = static_cast<size_t>(ctx.view.num_seqs);
  step_.num_heads = num_heads;
  step_.cols.assign(num_seqs, 0);
  step_.offsets.assign(num_seqs, 0);
  step_.layer_cols.assign(num_seqs * static_cast<size_t>(layout.num_layers), 0);
  int64_t total = 0;
  for (size_t i = 0; i < num_seqs; ++i) {
    const int32_t seq = ctx.batch.sequences[i].seq;
    int32_t cols = 0;
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      int32_t& layer_cols = step_.layer_cols[i * static_cast<size_t>(layout.num_layers) + layer];
      for (int h = 0; h < layout.num_kv_heads; ++h)
        layer_cols = std::max(layer_cols, ctx.cache.stream_length(seq, layer, h));
      cols = std::max(cols, layer_cols);
    }
    step_.cols[i] = cols;
    step_.offsets[i] = total;
    total += int64_t{layout.num_layers} * num_heads * cols;
  }
  if (step_.scores.numel() < total || step_.device != ctx.view.kv_device) {
    // Grown geometrically: a sequence's scores grow by one column per decode step.
    const int64_t grown = std::max(total, step_.device == ctx.view.kv_device ? 2 * step_.scores.numel() : 0);
    step_.scores = Tensor::empty(DType::kF32, {grown}, staging_allocator(ctx.view.kv_device));
    SE_CHECK(step_.scores.raw() != nullptr, "h2o: no staging memory for {} scores", grown);
    step_.device = ctx.view.kv_device;
  }
  step_.num_layers_scored = 0;
}

float* H2oMethod::StepScores::of(size_t slice, int layer) {
  return scores.data<float>() + offsets[slice] + int64_t{layer} * num_heads * cols[slice];
}

void H2oMethod::on_attention_end(LayerContext& ctx) {
  const int64_t num_heads = ctx.q.shape[1];
  const int64_t head_dim = ctx.q.shape[2];
  const int32_t num_layers = ctx.cache.layout().num_layers;
  if (ctx.layer == 0) plan_step_scores(ctx, num_heads);
  ++step_.num_layers_scored;
  for (int32_t i = 0; i < ctx.view.num_seqs; ++i) {
    const SequenceSlice& slice = ctx.batch.sequences[static_cast<size_t>(i)];
    const int32_t max_len = step_.layer_cols[static_cast<size_t>(i) * num_layers + ctx.layer];
    // [H, max_len]: per query head, the softmax summed over this sequence's n query rows; read in finish_step,
    // so no layer waits for the device.
    const TensorView out{step_.of(static_cast<size_t>(i), ctx.layer), DType::kF32, {num_heads, max_len},
                         Device::kCpu};
    const TensorView q{ctx.q.ptr<float>() + static_cast<int64_t>(slice.token_begin) * num_heads * head_dim,
                       DType::kF32,
                       {slice.num_tokens, num_heads, head_dim},
                       ctx.q.device};  // [n, H, D]
    attention_scores(out, q, ctx.view, i, ctx.params, ScoreReduce::kSum, ScoresReady::kAfterSynchronize);
  }
}

void H2oMethod::accumulate_step_scores(StepContext& ctx) {
  const KvLayout& layout = ctx.cache.layout();
  SE_CHECK(step_.num_layers_scored == layout.num_layers && step_.cols.size() == ctx.batch.sequences.size(),
           "h2o: the step scored {} of {} layers for {} of {} sequences", step_.num_layers_scored, layout.num_layers,
           step_.cols.size(), ctx.batch.sequences.size());
  step_.num_layers_scored = 0;
  synchronize(step_.device);
  const int64_t group = step_.num_heads / layout.num_kv_heads;
  for (size_t i = 0; i < ctx.batch.sequences.size(); ++i) {
    const SequenceSlice& slice = ctx.batch.sequences[i];
    const int32_t n = slice.num_tokens;
    SequenceScores& scores = scores_[slice.seq];
    if (scores.acc.empty()) {
      scores.num_kv_heads = layout.num_kv_heads;
      scores.acc.resize(static_cast<size_t>(layout.num_streams()));
    }
    // The streams are independent: on a GPU host the cores share them, as the device waits for this step.
#pragma omp parallel
    {
      std::vector<float> reduced;  // one stream's scores reduced over its query group
#pragma omp for collapse(2) schedule(static)
      for (int layer = 0; layer < layout.num_layers; ++layer) {
        for (int32_t kvh = 0; kvh < layout.num_kv_heads; ++kvh) {
          const int32_t max_len = step_.layer_cols[i * static_cast<size_t>(layout.num_layers) + layer];
          const float* head_scores = step_.of(i, layer) + kvh * group * max_len;  // [group, max_len] of [H, max_len]
          std::vector<float>& acc = scores.acc[static_cast<size_t>(layout.stream(layer, kvh))];
          const int32_t len = ctx.cache.stream_length(slice.seq, layer, kvh);
          SE_CHECK(static_cast<int64_t>(acc.size()) == len - n,
                   "h2o: seq {} layer {} head {} has {} scores for {} resident rows (state not restored?)", slice.seq,
                   layer, kvh, acc.size(), len - n);
          acc.resize(static_cast<size_t>(len), 0.0f);
          reduced.resize(static_cast<size_t>(len));
          reduce_group(head_scores, max_len, static_cast<int32_t>(group), reduced.data(), len, gqa_agg_);
          float* __restrict sums = acc.data();
          const float* __restrict row = reduced.data();
#pragma omp simd
          for (int32_t j = 0; j < len; ++j) sums[j] += row[j];
        }
      }
    }
  }
}

int32_t H2oMethod::recent_window_start(std::span<const int32_t> positions, int32_t num_logical) const {
  const int32_t start = num_logical - num_recent_;
  int32_t num_in_window = 0;
  for (const int32_t p : positions) num_in_window += p >= start ? 1 : 0;
  if (num_in_window == num_recent_) return start;
  std::vector<int32_t> order(positions.begin(), positions.end());
  std::nth_element(order.begin(), order.end() - num_recent_, order.end());
  return *(order.end() - num_recent_);
}

int32_t H2oMethod::lowest_scored_slot(std::span<const float> acc, std::span<const int32_t> positions,
                                      int32_t window_start) {
  int32_t lowest = -1;
  for (size_t j = 0; j < positions.size(); ++j) {
    if (positions[j] >= window_start) continue;
    const auto l = static_cast<size_t>(lowest);
    if (lowest < 0 || acc[j] < acc[l] || (acc[j] == acc[l] && positions[j] > positions[l]))
      lowest = static_cast<int32_t>(j);
  }
  return lowest;
}

void H2oMethod::keep_heavy_and_recent(std::span<const float> acc, std::span<const int32_t> positions,
                                      int32_t window_start, std::vector<int32_t>& kept) {
  // The candidates in position order, so ties keep the older token as they do in slot order.
  order_.clear();
  kept.clear();
  for (size_t j = 0; j < positions.size(); ++j)
    (positions[j] < window_start ? order_ : kept).push_back(static_cast<int32_t>(j));
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return positions[a] < positions[b]; });
  candidate_scores_.resize(order_.size());
  for (size_t i = 0; i < order_.size(); ++i) candidate_scores_[i] = acc[static_cast<size_t>(order_[i])];
  top_k_ascending(candidate_scores_.data(), static_cast<int32_t>(order_.size()), num_heavy_, heavy_);
  for (const int32_t i : heavy_) kept.push_back(order_[static_cast<size_t>(i)]);
  std::sort(kept.begin(), kept.end());
}

void H2oMethod::finish_step(StepContext& ctx) {
  accumulate_step_scores(ctx);
  const KvLayout& layout = ctx.cache.layout();
  for (const SequenceSlice& slice : ctx.batch.sequences) {
    auto it = scores_.find(slice.seq);
    SE_CHECK(it != scores_.end(), "h2o: no scores for seq {}", slice.seq);
    std::vector<std::vector<float>>& acc = it->second.acc;
    std::vector<std::vector<DroppedToken>>& dropped = it->second.dropped;
    dropped.resize(acc.size());
    for (std::vector<DroppedToken>& d : dropped) d.clear();
    if (const int32_t group = ctx.cache.sealed_groups(slice.seq, 0, 0).group_size; group > 0) {
      drop_lowest_groups(ctx, slice, group, it->second);
      continue;
    }
    const int32_t num_logical = ctx.cache.num_logical_tokens(slice.seq);
    const auto stream_acc = [&](int layer, int kv_head, size_t len) -> std::vector<float>& {
      std::vector<float>& scores = acc[static_cast<size_t>(layout.stream(layer, kv_head))];
      SE_CHECK(scores.size() == len, "h2o: acc out of step with stream");
      return scores;
    };
    // Heavy hitters: the num_heavy_ largest acc among the tokens older than the recent window (on a
    // sliding-window layer, heavy hitters the layer cannot see are no use to it: it keeps the tail). A decode step
    // drops the lowest of them, every stream on its own core (the scans are most of the step's host work).
    const BudgetEvictions evicted = evict_to_budget(
        ctx, slice, num_heavy_ + num_recent_, "h2o", scratch_,
        [&](std::span<KvStreams::SlotEviction> streams) {
#pragma omp parallel for schedule(static)
          for (size_t i = 0; i < streams.size(); ++i) {
            KvStreams::SlotEviction& e = streams[i];
            const std::span<const int32_t> positions = ctx.cache.slot_positions(slice.seq, e.layer, e.kv_head);
            const std::vector<float>& scores = stream_acc(e.layer, e.kv_head, positions.size());
            e.slot = lowest_scored_slot(scores, positions, recent_window_start(positions, num_logical));
            const auto slot = static_cast<size_t>(e.slot);
            dropped[static_cast<size_t>(layout.stream(e.layer, e.kv_head))].push_back({positions[slot], scores[slot]});
          }
        },
        [&](int layer, int kv_head, std::span<const int32_t> positions, std::vector<int32_t>& kept) {
          const std::vector<float>& scores = stream_acc(layer, kv_head, positions.size());
          keep_heavy_and_recent(scores, positions, recent_window_start(positions, num_logical), kept);
          std::vector<DroppedToken>& out = dropped[static_cast<size_t>(layout.stream(layer, kv_head))];
          for (size_t j = 0, k = 0; j < positions.size(); ++j) {
            if (k < kept.size() && kept[k] == static_cast<int32_t>(j)) {
              ++k;
            } else {
              out.push_back({positions[j], scores[j]});
            }
          }
        });
    for (const KvStreams::SlotEviction& e : evicted.slots) {
      std::vector<float>& scores = acc[static_cast<size_t>(layout.stream(e.layer, e.kv_head))];
      scores[static_cast<size_t>(e.slot)] = scores.back();
      scores.pop_back();
    }
    for (const KvStreams::StreamEviction& e : evicted.streams)
      keep_scores(acc[static_cast<size_t>(layout.stream(e.layer, e.kv_head))], e.kept);
  }
}

void H2oMethod::keep_scores(std::vector<float>& acc, std::span<const int32_t> kept) {
  // `kept` ascends, so compacting in place never overwrites a score before it moves.
  for (size_t i = 0; i < kept.size(); ++i) acc[i] = acc[static_cast<size_t>(kept[i])];
  acc.resize(kept.size());
}

void H2oMethod::on_stream_compacted(int32_t seq, int layer, int kv_head, std::span<const int32_t> kept) {
  auto it = scores_.find(seq);
  if (it == scores_.end()) return;
  keep_scores(it->second.acc[static_cast<size_t>(layer * it->second.num_kv_heads + kv_head)], kept);
}

std::unique_ptr<MethodSequenceState> H2oMethod::export_sequence_state(int32_t seq) {
  auto it = scores_.find(seq);
  if (it == scores_.end()) return nullptr;
  auto state = std::make_unique<ExportedScores>();
  state->scores = std::move(it->second);
  scores_.erase(it);
  return state;
}

Status H2oMethod::import_sequence_state(int32_t seq, std::unique_ptr<MethodSequenceState> state) {
  if (!state) return Status::ok();
  auto* exported = dynamic_cast<ExportedScores*>(state.get());
  if (exported == nullptr) return invalid_argument("h2o: sequence {} was given another method's state", seq);
  if (scores_.count(seq) != 0) return failed_precondition("h2o: sequence {} already has scores", seq);
  scores_.emplace(seq, std::move(exported->scores));
  return Status::ok();
}

nlohmann::json H2oMethod::debug_state(int32_t seq) const {
  auto it = scores_.find(seq);
  if (it == scores_.end()) return nullptr;
  const SequenceScores& scores = it->second;
  nlohmann::json acc = nlohmann::json::array(), dropped = nlohmann::json::array();
  for (size_t stream = 0; stream < scores.acc.size(); ++stream) {
    if (stream % static_cast<size_t>(scores.num_kv_heads) == 0) {
      acc.push_back(nlohmann::json::array());
      dropped.push_back(nlohmann::json::array());
    }
    acc.back().push_back(scores.acc[stream]);
    nlohmann::json tokens = nlohmann::json::array();
    if (stream < scores.dropped.size())
      for (const DroppedToken& t : scores.dropped[stream]) tokens.push_back({t.position, t.score});
    dropped.back().push_back(std::move(tokens));
  }
  return {{"acc", acc}, {"dropped", dropped}};
}

}  // namespace se
