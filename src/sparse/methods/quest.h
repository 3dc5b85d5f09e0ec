// quest (mit-han-lab/Quest, E2E kernel path): query-aware page selection. Every token stays resident (the radix
// prefix cache applies); each decode step, in every layer >= dense_layers, attention reads only the pages whose
// key bounds promise the largest q.k. Per pool page the method keeps the elementwise min and max of the keys it
// stores (refreshed as tokens land, so a partial last page bounds the keys it has so far); a page's score is the
// upper bound sum_d max(q_d * min_d, q_d * max_d), reduced over each KV head's query group (gqa_agg). Page budget
// = token_budget / page_size and includes the last page, which is always read; the top (budget - 1) of the other
// pages join it; a stream of at most `budget` pages is read whole. Prefill is dense.
// Under --kv-partitions, `two_level_group` > 0 ranks groups of that many pages by their summaries first, then the
// pages of the best `two_level_kept_groups` (Spin's two-level metadata, quest_two_level_index.h); it means nothing
// elsewhere, and the engine refuses it there.
//
// Ranking runs where the pool lives, for the whole batch in one op (select_pages_by_key_bounds): on a GPU the page
// lists go from the scoring kernels to attention without visiting the host, in one batch-wide layout that
// attention reads by value, so a decode step enqueues no host copy and replays as a CUDA graph.
//
// Ownership: the bounds tensor is indexed by pool page id, so it is sized in create_cache from the pool. Pages
// shared through the radix cache are full and immutable, so the bounds their writer computed stay valid.
// Engine thread only.
// Sliding-window layers (Gemma 3's local layers) stay dense: their window already bounds what they read.
// Over an MLA model's shared latent the bounds are those of the latent keys [c ; k_rope] (kv_lora_rank + qk_rope
// channels) and the query is the absorbed one, so a page's bound is on the logits the model attends with; the
// group reduction runs over every query head.
// Over the quantized stores (CPU): FP8 pages are bounded over their keys as attention decodes them (f32 bounds), and
// a selection of FP8 pages is read through the FP8 attention. Over KIVI a page is a key group (selection_page_tokens:
// --kivi-group-size tokens, the store's own page, whatever --page-size says): a quantized group is bounded once,
// when the step after its flush sees it, from its codes (per channel the decoded smallest and largest code, the
// bounds of the keys attention decodes), and the groups of window keys are bounded from their full-precision rows
// as they are ranked; the selected groups are read through KIVI's attention, window keys and values as they are.
#pragma once

#include <unordered_map>
#include <vector>

#include "sparse/method_config.h"
#include "sparse/method_runtime.h"

namespace se {

class QuestMethod final : public MethodRuntime {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  // The paged cache, plus a bounds tensor [num_pages, 2, head_dim] (key_bounds_dtype) for its pool; under Spin's
  // partitions the tiered cache, whose partitions keep the bounds.
  Result<std::unique_ptr<CacheManager>> create_cache(const CacheSpec& spec) override;
  // Its budget, group reduction and dense layers, and the two-level ranking when configured.
  std::optional<PartitionConfig> partition_config() const override {
    PartitionConfig config;
    config.token_budget = token_budget_;
    config.gqa_agg = gqa_agg_;
    config.dense_layers = dense_layers_;
    config.two_level = two_level_;
    return config;
  }
  size_t page_metadata_bytes(const KvLayout& layout) const override {
    return 2 * static_cast<size_t>(layout.head_dim) * dtype_size(key_bounds_dtype(layout.dtype));
  }

  // Grows the page lists and the ranking's stride for the step's decode sequences.
  void prepare_step(StepContext& ctx) override;
  // Every layer from dense_layers on: the bounds of the pages that took new tokens, then (full-attention layers,
  // decode sequences) the page ranking of the whole batch in one op.
  void build_layer_selection(LayerContext& ctx, Selection& selection) override;
  // The selected pages' tokens, and the bounds of every page of every stream the ranking scores.
  DecodeReads decode_reads(int layer, int32_t sliding_window, const AttentionView& view, int32_t slice) const override;
  // Prefix pruning compacted kept keys into these pages, or they came back from the host tier: their bounds are
  // recomputed.
  void on_pages_rewritten(int layer, const AttentionView& view) override;
  // Forgets which of the sequence's KIVI groups are bounded.
  void on_sequence_end(int32_t seq) override;

  // The bounds' element type over pages of `page_dtype`: the pool's own float type, and f32 over FP8 codes (which
  // Quest reads on the CPU only), so a bound is the decoded key's value.
  static DType key_bounds_dtype(DType page_dtype) { return page_dtype == DType::kU8 ? DType::kF32 : page_dtype; }

 private:
  QuestMethod(nlohmann::ordered_json config, int token_budget, int dense_layers, GroupReduce gqa_agg,
              std::optional<TwoLevelConfig> two_level);
  // Tokens the last query row of a decode sequence with tables `sv` reads over its KV heads.
  int64_t tokens_read(const SeqKvView& sv, int32_t num_kv_heads, int32_t page_size) const;
  // Lists for num_seqs sequences and a ranking stride covering streams of longest_stream_pages pages; a move
  // or a new stride makes captured decode steps stale (StepGraph::note_buffers_moved).
  void reserve_ranking(Device device, int32_t num_seqs, int32_t num_kv_heads, int32_t page_budget,
                       int32_t longest_stream_pages);
  // Over KIVI: bounds the layer's key groups each batch sequence has quantized since its last step.
  void update_kivi_group_bounds(const LayerContext& ctx);

  int token_budget_ = 0;
  int dense_layers_ = 0;
  GroupReduce gqa_agg_ = GroupReduce::kMean;
  std::optional<TwoLevelConfig> two_level_;  // set: Spin's two-level ranking under the partitions

  Tensor bounds_;  // [num_pool_pages, 2 (min, max), head_dim] of the pool's dtype, where the pool lives
  // One layer's page lists, where the pool lives: [list_capacity_seqs_][num_kv_heads][page budget] and their
  // counts [list_capacity_seqs_][num_kv_heads], batch sequence s at row s. Attention reads a layer's lists before
  // the next layer's ranking overwrites them (stream order on a GPU).
  Tensor page_lists_;
  Tensor page_counts_;
  int32_t list_capacity_seqs_ = 0;
  int32_t list_budget_ = 0;
  int32_t ranking_capacity_pages_ = 0;  // max_pages_per_stream of the ranking; grows with the longest stream
  // Over KIVI, per open sequence and stream (layer * num_kv_heads + KV head): its quantized groups whose bounds are
  // written (a group's codes never change, and no page of a sequence is shared, so the count is the sequence's own).
  std::unordered_map<int32_t, std::vector<int32_t>> bounded_groups_;
  std::vector<int32_t> first_groups_;  // scratch of update_kivi_group_bounds
};

}  // namespace se
