// shadowkv (bytedance/ShadowKV; the algorithm and our departures from the reference: shadowkv_sketch.h and
// docs/fidelity.md "ShadowKV"): dynamic chunk selection over a low-rank sketch of the prompt's keys.
//
// Prefill attends densely. In the step that completes a prompt of at least `min_prompt_tokens` tokens, each full-
// attention layer sketches the prompt (shadowkv_sketch: SVD of the pre-RoPE keys, chunk landmarks, outlier chunks,
// the local window) and rewrites, in the sequence's pages, the keys of every sketched chunk that is not an outlier
// by their low-rank rebuild rotated at their positions: those are the only keys a decode step can read for them.
// Each decode step then reads, per KV head, the local window, the outlier chunks, the sparse_budget / chunk_size
// chunks whose landmarks score best against the step's query, and every token after the prompt. Values are read
// exact, for those tokens only.
//
// The pre-RoPE keys come from the cache's post-RoPE keys rotated back (RoPE is a rotation, scaled by YaRN's
// attention factor), so the model needs no hook. The rewrite makes the pages the sequence's own: the method keeps
// no full history for the radix cache to share, and a retained chain carries its sketch with it (tokens past the
// sketch are read exact, as the reference reads its generated tokens). Sliding-window layers stay dense. CPU only
// (gather_keys has no CUDA kernel). Engine thread only.
// Tensor parallelism: the SVD factors the keys of the layer's every KV head together, so each rank all-gathers the
// others' pre- and post-RoPE prompt keys, sketches them as one rank does and keeps its heads' part; the rest is per
// KV head.
// Under --kv-partitions the partitions retrieve only the pages of the tokens a decode step reads
// (PartitionConfig::method_tokens): the sketch is built and the keys rewritten while a prefill chunk holds the layer
// resident, and the sketch, which stays here, picks the chunks.
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "sparse/method_runtime.h"
#include "sparse/methods/shadowkv_sketch.h"

namespace se {

class ShadowKvMethod final : public MethodRuntime {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  void on_attention_end(LayerContext& ctx) override;
  void build_decode_selection(LayerContext& ctx, int32_t slice, Selection& selection) override;
  void on_sequence_end(int32_t seq) override { sketches_.erase(seq); }
  // Under Spin's partitions (PartitionConfig::method_tokens): a step reads per KV head its chosen, outlier and
  // local chunks, and the partitions bring in only their pages; the sketch stays here, beside the pool.
  std::optional<PartitionConfig> partition_config() const override;
  // The sketch of a page's tokens at most: a landmark (head_dim floats) and its chunk id per chunk.
  int64_t state_bytes_per_page(const KvLayout& layout) const override;
  std::unique_ptr<MethodSequenceState> export_sequence_state(int32_t seq) override;
  Status import_sequence_state(int32_t seq, std::unique_ptr<MethodSequenceState> state) override;

 private:
  // Per layer, what a decode step reads of the sketch: the landmarks and outliers (the low-rank factors are spent
  // once the keys are rewritten). Empty: the layer is dense.
  using SequenceSketch = std::vector<std::optional<ShadowKvLayerSketch>>;  // [num_layers]
  struct State;

  ShadowKvMethod(nlohmann::ordered_json config, ShadowKvParams params, int32_t min_prompt_tokens);
  void sketch_layer(LayerContext& ctx, int32_t slice, int32_t num_tokens, SequenceSketch& layers);
  // Rows [num_rows, this rank's KV heads, d] of every tensor-parallel rank side by side: [num_rows, every KV head,
  // d] in head order (a collective over several ranks; `mine` itself on one).
  std::vector<float> heads_of_every_rank(const std::vector<float>& mine, int32_t num_rows) const;

  ShadowKvParams params_;
  int32_t min_prompt_tokens_ = 0;
  std::unordered_map<int32_t, SequenceSketch> sketches_;  // by seq slot
};

}  // namespace se
