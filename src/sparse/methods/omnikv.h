// omnikv (antgroup/OmniKV, "last" selector): dynamic token selection at a few filter layers, reused by the
// layers after each. Every token stays resident (the radix prefix cache applies); only what attention reads
// changes. At each decode step, a filter layer scores every prompt token j < prefill_len by its raw logit
// max over all query heads of q_h . k_j / sqrt(d) (its own q for the new token, its own cached keys, no
// softmax) and keeps the top N, ascending: one index shared by every head. The filter layer itself attends
// densely; the sparse layers of its segment attend the selected prompt tokens plus every token past the prompt
// (the decode tail). Prefill is dense.
//
// Layer roles, for `filter_layers` F (entries >= num_layers dropped, sorted, deduplicated) in a model of L
// layers: the full layers are [0, F0) u F u {L}; for each full layer l < L with next full layer r, layers
// [l, min(r, l + num_wait + 1)) run dense and [l + num_wait + 1, r) run sparse on l's index. With no filter layer
// inside the model every layer is dense. E.g. F = {2, 8, 18}, num_wait = 1, L = 32: dense {0-3, 8, 9, 18, 19},
// sparse 4-7 (from 2), 10-17 (from 8), 20-31 (from 18).
//
// The index of a sequence lives here from its filter layer to the last sparse layer of that segment in the same
// step (the controller runs layers in order). It is ranked and turned into the sparse layers' per-head lists
// where the pool lives (top_keys_by_logits_max_over_heads, token_lists_with_tail), so on a GPU no index reaches
// the host and the step does not wait for it. Engine thread only.
// Sliding-window layers (Gemma 3's local layers) stay dense: their window already bounds what they read.
// Under --kv-partitions the partitions run this selection over KV on the host tier (PartitionConfig::token_filters).
// Tensor parallelism: each rank's filter scores are the max over its own query heads; the ranks all-gather them and
// take the max of those, which is the max over every head in any order, so every rank keeps the one rank's index.
#pragma once

#include <unordered_map>
#include <vector>

#include "sparse/method_config.h"
#include "tensor/tensor.h"
#include "sparse/method_runtime.h"

namespace se {

class OmniKvMethod final : public MethodRuntime {
 public:
  enum class LayerRole : uint8_t { kDense, kFilter, kSparse };

  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  void build_decode_selection(LayerContext& ctx, int32_t slice, Selection& selection) override;
  // The buffers stay for the next sequence given the same id.
  void on_sequence_end(int32_t seq) override {
    if (auto it = indices_.find(seq); it != indices_.end()) it->second.filter_layer = -1;
  }

  // Its layer plan and kept tokens as Spin's partitions run them (PartitionConfig::token_filters); the model's layers
  // are known only once the cache is built, so the engine completes it (complete_partition_config). nullopt under
  // selected_fraction, whose kept tokens, and so the pages they lie in, have no bound before the prompt comes.
  std::optional<PartitionConfig> partition_config() const override;
  void complete_partition_config(PartitionConfig& config, int32_t num_layers) const override;

  // Role of every layer of a model with `num_layers` layers; for a sparse layer, `source` is its filter layer.
  struct LayerPlan {
    std::vector<LayerRole> roles;  // [num_layers]
    std::vector<int32_t> sources;  // [num_layers] the filter layer whose index a sparse layer reads, else -1
  };
  LayerPlan plan_layers(int32_t num_layers) const;

 private:
  // A sequence's current index: the prompt tokens its last filter layer kept, and the sparse layers' lists built
  // from it, where the pool lives.
  struct TokenIndex {
    int32_t filter_layer = -1;  // -1: none yet (a new sequence under this id)
    int32_t position = -1;      // logical position of the decode step that computed it
    Tensor tokens;              // I32 [num_kept]: ascending prompt token indices
    Tensor lists;               // I32 [num_kv_heads, stride]: per KV head, tokens then the decode tail
    Tensor counts;              // I32 [num_kv_heads]
    int64_t tokens_read = 0;    // sum of counts, known on the host
  };
  // Decode steps the lists have room for beyond the current tail when they grow.
  static constexpr int64_t kTailRoom = 512;

  OmniKvMethod(nlohmann::ordered_json config, std::vector<int> filter_layers, int num_wait,
               int num_selected_tokens, double selected_fraction);
  // Prompt tokens to keep for a prompt of `prefill_len` tokens.
  int32_t num_kept_tokens(int32_t prefill_len) const;
  const LayerPlan& plan(int32_t num_layers);
  void select_tokens(LayerContext& ctx, int32_t slice, int32_t prefill_len, int32_t num_kept, TokenIndex& index);
  // top_keys_by_logits_max_over_heads over the query heads of every tensor-parallel rank (CPU ranks).
  void top_keys_over_every_rank(TensorView out_tokens, TensorView q, const AttentionView& view, int32_t slice,
                                int32_t num_keys, float scale) const;

  std::vector<int> filter_layers_;
  int num_wait_ = 0;
  int num_selected_tokens_ = 0;
  double selected_fraction_ = 0.0;  // > 0: N = int(fraction * prefill_len) instead of num_selected_tokens

  LayerPlan plan_;                                  // for plan_num_layers_ layers
  int32_t plan_num_layers_ = -1;
  std::unordered_map<int32_t, TokenIndex> indices_;  // by sequence id
};

}  // namespace se
