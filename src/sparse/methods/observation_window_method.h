// ObservationWindowMethod: the lifecycle the SnapKV family shares (snapkv, pyramidkv, adakv, chunkkv): dense
// prefill, then one compression per sequence at the end of its prompt, scored by the prompt's last `window`
// queries (observation_window_scores.h). Subclasses only choose which prefix tokens each (layer, KV head)
// keeps and state their memory model. Engine thread only.
//
// Per sequence and layer, in on_attention_end:
//   * every prefill chunk: the chunk's q rows (post-RoPE) at prompt positions >= T - window are kept, so the
//     window is complete even when the prompt arrives in several chunks (T = the sequence's prefill tokens);
//   * the chunk that completes the prompt (all of the layer's prompt keys are stored): the window's softmax
//     over the whole stream (attention_scores, kSum) -> WindowScores -> select_prefix() -> kept indices =
//     the selected prefix plus the window [T - w, T), per KV head.
// finish_step (after sampling) of that step evicts every (layer, KV head) to its kept set (cache.evict frees
// the pages the same step) and drops the sequence's state. Prompts of T <= budget are never compressed.
// Decode then appends to the compacted streams; kept keys keep their RoPE and new tokens their absolute
// positions (the cache's logical counter). State is keyed by sequence id and dropped in on_sequence_end.
// Chain Cache turns: a resumed sequence prefills only its new prompt tokens on top of the retained streams, and
// its prompt completes like any other: when the streams have equal lengths and the turn's own rows fill the
// window, the whole stream (retained tokens and new ones) is scored and compressed again; streams that differ in
// length (AdaKV's per-head budgets) or a new prompt shorter than the window are left as they are, and the next
// turn compresses. The window rows are read
// from host memory (CPU backend); the CUDA path will need a device copy of them.
// Tensor parallelism: each rank compresses its own KV heads; whether a resumed sequence's streams are equal is
// asked of every rank's heads (an all-gather of the answers), so all ranks compress the layer or none does.
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "sparse/method_runtime.h"
#include "sparse/methods/observation_window_scores.h"

namespace se {

class ObservationWindowMethod : public MethodRuntime {
 public:
  const ObservationWindowConfig& window_config() const { return window_config_; }

  // Before the prompt completes (num_tokens < num_prefill_tokens) every token is resident; afterwards the
  // compressed prompt (compressed_pages) plus the decode tokens.
  int64_t resident_pages(const KvLayout& layout, int32_t num_prefill_tokens, int32_t num_tokens) const override;
  void on_attention_end(LayerContext& ctx) override;
  void finish_step(StepContext& ctx) override;
  void on_sequence_end(int32_t seq) override { sequences_.erase(seq); }

 protected:
  ObservationWindowMethod(std::string name, nlohmann::ordered_json config,
                          const ObservationWindowConfig& window_config);

  // Per KV head, the ascending indices (< scores.num_prefix) of the prefix tokens layer `layer` of
  // `num_layers` keeps; called only for prompts longer than the budget.
  virtual std::vector<std::vector<int32_t>> select_prefix(const WindowScores& scores, int layer,
                                                          int num_layers) const = 0;
  // Pages over all streams once a prompt of `num_prompt_tokens` (> budget) is compressed and `num_decode_tokens`
  // tokens were appended after it.
  virtual int64_t compressed_pages(const KvLayout& layout, int32_t num_prompt_tokens,
                                   int32_t num_decode_tokens) const = 0;

  // For a choice that spans a layer's KV heads (select_prefix of AdaKV, ChunkKV): `select_all` run over the
  // scores of every tensor-parallel rank's heads, gathered in head order, and this rank's heads' part of its
  // answer; `select_all(scores)` itself on one rank. Every rank gets the one rank's bits.
  std::vector<std::vector<int32_t>> select_over_every_rank(
      const WindowScores& scores,
      const std::function<std::vector<std::vector<int32_t>>(const WindowScores&)>& select_all) const;

 private:
  // Whether every rank's streams of a layer hold `num_tokens` tokens each and may be evicted, given `equal_here`,
  // whether this rank's do; a collective when there are several ranks.
  bool streams_equal_on_every_rank(bool equal_here, int32_t num_tokens) const;

  struct SequenceState {
    std::vector<std::vector<float>> window_q;           // [layer] -> [rows, H, D] q of positions >= T - window
    std::vector<std::vector<std::vector<int32_t>>> kept;  // [layer][kv_head] ascending; empty = not computed
  };

  ObservationWindowConfig window_config_;
  std::unordered_map<int32_t, SequenceState> sequences_;  // by sequence id, while a prompt is being compressed
  std::vector<float> probs_;  // scratch: [H, T] window probabilities of one sequence
  Tensor window_q_on_device_;  // scratch: the window rows on the forward's device, where the scoring op reads q
};

}  // namespace se
