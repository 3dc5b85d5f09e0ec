// h2o: Heavy-Hitter Oracle, the real-drop variant (FMInference/H2O `h2o_hf/utils_real_drop`,
// `H2OKVCache_LayerWise`). Every (layer, KV head) stream keeps the `heavy` tokens with the largest accumulated
// attention plus the `recent` newest tokens; the rest is physically evicted. Engine thread only.
//
// State (the method's per-sequence metadata, keyed by sequence id, dropped in on_sequence_end): per stream an
// accumulated score vector acc aligned with the stream's resident rows.
//   * Update, every step (prefill chunks and decode) after attention (on_attention_end): the step's n queries
//     of the sequence attend causally to the resident keys (what earlier steps left) plus their own n keys; each
//     query head's softmax is summed over those n rows (backend attention_scores, ScoreReduce::kSum) and the
//     query group is reduced to its KV head with `gqa_agg` (mean by default: our GQA choice, METHODS.md; the
//     reference is MHA / per query head). acc[j] += that column sum; the n new rows start at their column sums.
//     Each layer's sums are enqueued after its attention and added in finish_step, so the step waits for the
//     device once, not once per layer.
//   * Eviction, after every step (finish_step): a stream of T > heavy + recent tokens keeps top-`heavy` of the
//     acc of the tokens older than its `recent` newest (ties: the older token) plus those `recent`; acc follows
//     its rows. A decode step (T = heavy + recent + 1) drops the one lowest and moves its newest row into that
//     slot (budget_eviction.h), so slot order is not position order; the window is found by position.
// This matches the reference, which updates and evicts inside each layer's attention right after the softmax:
// one forward = one step, whatever its length (a whole prompt, a prefill chunk or one decode token).
// NOTE: the softmax stays fp32 (the reference casts it to the model dtype before summing); fp32 sums rank the
// same up to rounding ties. RoPE: keys keep their original rotation and new tokens their absolute positions
// (the reference's non-streaming class; `_streaming`'s query-position shift is out of scope).
//
// Over a KIVI store (--kv-cache-dtype kivi2|kivi4, CPU; docs/fidelity.md, "H2O over KIVI") a stream drops whole
// sealed groups only (KvStreams::sealed_groups: G tokens whose keys and values are all quantized, one page), as the
// scores accumulate the same way (attention_scores reads the quantized groups as attention does): after each step a
// stream holding at least budget + G tokens drops, of its sealed groups older than its `recent` newest tokens, the
// ones of least summed acc (ties: the newer group) until it holds under budget + G, or until no such group is left.
// Summing is H2O's own objective, the acc mass the kept tokens hold, maximized over whole groups: every group has G
// tokens, so dropping the lowest sums keeps the most. A sliding-window layer drops every such group, oldest first (it
// keeps its tail, as below). Slots stay in position order, since only whole groups leave.
//
// Config: budget (tokens kept per stream, default 2048) split by heavy_ratio (default 0.5: heavy = floor(budget
// * heavy_ratio), recent = budget - heavy); or an explicit `heavy` and/or `recent` (the missing one is budget
// minus the given one; both given define the budget). Reference defaults differ: the real-drop class uses hh 4 /
// recent 512, its streaming demo hh 4 / recent 2000, and the paper's simulated-mask runs heavy = recent = 10% of
// the prompt. We keep the paper's equal heavy/recent split over a fixed budget (the benchmark budget).
// gqa_agg in {mean, max, sum}.
#pragma once

#include <span>
#include <unordered_map>
#include <vector>

#include "sparse/budget_eviction.h"
#include "sparse/group_reduce.h"
#include "sparse/method_config.h"
#include "sparse/method_runtime.h"

namespace se {

class H2oMethod final : public MethodRuntime {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  // Every stream holds min(num_tokens, heavy + recent) tokens once a step is done (budget_resident_pages); over KIVI
  // at most max_kept_in_groups tokens (KiviCacheManager::sealed_group_eviction_pages).
  int64_t resident_pages(const KvLayout& layout, int32_t num_prefill_tokens, int32_t num_tokens) const override;
  // Enqueues the step's column sums of every sequence (copied to host memory as the device gets to them).
  void on_attention_end(LayerContext& ctx) override;
  // Adds the step's column sums to every sequence's acc (new rows appended), then evicts every stream of the
  // step's sequences that holds more than heavy + recent tokens.
  void finish_step(StepContext& ctx) override;
  // A pruned stream's scores follow its kept slots.
  void on_stream_compacted(int32_t seq, int layer, int kv_head, std::span<const int32_t> kept) override;
  void on_sequence_end(int32_t seq) override { scores_.erase(seq); }
  // The accumulated scores travel with a retained turn: the next turn evicts by them.
  std::unique_ptr<MethodSequenceState> export_sequence_state(int32_t seq) override;
  Status import_sequence_state(int32_t seq, std::unique_ptr<MethodSequenceState> state) override;
  // {"acc": [layer][kv_head] -> acc in stream order, "dropped": [layer][kv_head] -> [[position, acc], ...] of the
  // tokens the last step's eviction dropped from a full-attention stream}, or null for an unknown sequence. Where
  // two runs keep different tokens, both runs' scores of the tokens in question are then at hand.
  nlohmann::json debug_state(int32_t seq) const override;

 private:
  H2oMethod(nlohmann::ordered_json config, int32_t num_heavy, int32_t num_recent, GroupReduce gqa_agg);
  // Over a store of quantized groups: the most tokens a stream holds after a step, the larger of the budget and the
  // store's window, plus all but one token of a group.
  int32_t max_kept_in_groups(const KvLayout& layout) const;
  // Of a stream's first `num_candidates` groups, the `num_dropped` of least summed acc, ascending, into
  // dropped_groups_.
  void choose_lowest_groups(std::span<const float> acc, int32_t group_size, int32_t num_candidates,
                            int32_t num_dropped);
  // A stream's scores after it kept slots `kept` (ascending).
  static void keep_scores(std::vector<float>& acc, std::span<const int32_t> kept);
  // The oldest position of a stream's recent window: the num_recent_-th largest of `positions`, which is
  // num_logical - num_recent_ unless chain pruning cut into the window.
  int32_t recent_window_start(std::span<const int32_t> positions, int32_t num_logical) const;
  // The slot of the lowest acc older than the window (ties: the newer token goes, as top_k_ascending keeps the
  // older one).
  static int32_t lowest_scored_slot(std::span<const float> acc, std::span<const int32_t> positions,
                                    int32_t window_start);
  // The slots of the num_heavy_ largest acc older than the window, plus the window's, ascending.
  void keep_heavy_and_recent(std::span<const float> acc, std::span<const int32_t> positions, int32_t window_start,
                             std::vector<int32_t>& kept);
  // Sizes step_ for the step's sequences and measures every layer's longest stream (at layer 0, when every stream
  // already holds the step's new rows; nothing changes their lengths before finish_step).
  void plan_step_scores(const LayerContext& ctx, int64_t num_heads);
  // Waits for the step's scores, then adds them to acc.
  void accumulate_step_scores(StepContext& ctx);

  int32_t num_heavy_ = 0;   // heavy hitters kept per stream
  int32_t num_recent_ = 0;  // newest tokens kept per stream
  GroupReduce gqa_agg_ = GroupReduce::kMean;
  struct DroppedToken {
    int32_t position = 0;
    float score = 0.0f;
  };
  struct SequenceScores {
    int32_t num_kv_heads = 0;
    std::vector<std::vector<float>> acc;  // [layer * num_kv_heads + kv_head] -> one score per resident row
    std::vector<std::vector<DroppedToken>> dropped;  // [stream] what the last eviction dropped (debug_state)
  };
  struct ExportedScores final : MethodSequenceState {
    SequenceScores scores;
  };
  // Drops the sealed groups of sequence `slice` the rule over groups names, every stream in one evict_streams call,
  // and their scores.
  void drop_lowest_groups(StepContext& ctx, const SequenceSlice& slice, int32_t group_size, SequenceScores& scores);

  std::unordered_map<int32_t, SequenceScores> scores_;  // by sequence id
  // One step's column sums, every layer of every sequence of the batch, in staging memory of the pool's device.
  struct StepScores {
    Tensor scores;  // per sequence i: [num_layers][H][cols[i]], layer l's [H, layer_cols] at its start
    Device device = Device::kCpu;
    int64_t num_heads = 0;
    std::vector<int32_t> cols;        // [num_seqs] the longest stream of the sequence
    std::vector<int64_t> offsets;     // [num_seqs]
    std::vector<int32_t> layer_cols;  // [num_seqs][num_layers] the longest stream of the layer
    int32_t num_layers_scored = 0;    // layers whose on_attention_end ran since the plan
    float* of(size_t slice, int layer);
  };
  StepScores step_;
  BudgetEvictionScratch scratch_;  // of finish_step
  std::vector<int32_t> order_;            // of keep_heavy_and_recent
  std::vector<float> candidate_scores_;   // of keep_heavy_and_recent
  std::vector<int32_t> heavy_;            // of keep_heavy_and_recent
  std::vector<float> group_scores_;       // of choose_lowest_groups
  std::vector<int32_t> dropped_groups_;   // of choose_lowest_groups
};

}  // namespace se
