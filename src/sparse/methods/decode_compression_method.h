// DecodeCompressionMethod: the lifecycle the decode-time compression methods share (rkv, kara): the prompt
// is prefilled densely and stays as it is; as the sequence decodes, the method keeps its recent queries and, at
// the decode steps its policy picks, rescores one region of the generated tokens and physically evicts the rest
// of that region, returning the freed pages to the pool in the same step. Subclasses choose when and which region
// (plan_compression) and which of its tokens each (layer, KV head) keeps (select). Engine thread only.
//
// Per decode step of a sequence:
//   * prepare_step places the step's query rows in the sequences' RecentQueries rings (an ended sequence's rings
//     serve the next one, so a GPU neither allocates nor frees them in a steady state) and uploads where they go,
//     one table for the step;
//   * on_attention_end: the post-RoPE query rows of each layer go to those places in bf16, every decode slice's
//     rows of the layer by one op where the queries live (device memory on a GPU: nothing reaches the host). The
//     forward thus enqueues the same work every step, and a decode step replays as a CUDA graph;
//   * finish_step: plan_compression sees the clock (decoded tokens, generated tokens resident, the position where
//     uncompressed tokens begin) and may name a region [first, end) of positions and how many of the newest
//     queries score it. Each layer then reads the region's keys (gather_keys: slot order is position order,
//     since this method only ever compacts) and score() enqueues the region's scores beside them, on the device
//     where the pool lives; the scores of every layer come to the host in one copy (the step's only round trip,
//     scores only, never K/V), select() picks the kept tokens per KV head there, and every stream of the
//     sequence is compacted at once on the device (KvStreams::evict_streams), its freed pages returned in the
//     same step: tokens outside the region all stay. On a sliding-window layer the stream keeps its tail instead
//     (sliding_window_tail.h), as many tokens as the full layers keep.
// Composed with a prompt-time method (the registry's "prompt_method", an eviction method that compresses a prompt
// once at its end and keeps every KV head of a layer at the same length), that method runs every hook first: it
// compresses the prompt at the end of prefill, and the generated part after it is this method's. The sequence's
// memory is the prompt method's model with this method's generated tokens resident as its decode tokens.
// A sequence's prompt is the part before SequenceSlice::num_prefill_tokens: a resumed Chain Cache turn (whose
// prompt is the whole retained chain, compressed decode state included) and a preempted sequence (which
// recomputes its outputs as prompt) start their generated part again at their new prompt's end.
// Tensor parallelism: each rank compresses its own KV heads with its own query heads' queries; the prompt method
// is handed the rank's communicator, so one whose choices span the heads (ChunkKV) joins the ranks as it does alone.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/staged_buffer.h"
#include "sparse/method_runtime.h"
#include "sparse/methods/recent_queries.h"

namespace se {

class DecodeCompressionMethod : public MethodRuntime {
 public:
  // Every prompt token, plus the most generated tokens resident at once by the step that brings the sequence to
  // `num_tokens` (peak_generated_tokens), per stream.
  int64_t resident_pages(const KvLayout& layout, int32_t num_prefill_tokens, int32_t num_tokens) const override;
  int32_t transient_extra_tokens(int32_t num_prefill_tokens) const override;
  // The recent queries' ring: capacity bf16 rows per layer (plus the prompt method's own).
  int64_t sequence_device_bytes(const KvLayout& layout, int64_t query_row_elements) const override;
  void prepare_step(StepContext& ctx) override;
  void on_attention_end(LayerContext& ctx) override;
  void on_layer_end(int layer, const ForwardBatch& batch, TensorView hidden) override;
  void finish_step(StepContext& ctx) override;
  void on_pages_rewritten(int layer, const AttentionView& view) override;
  void on_stream_compacted(int32_t seq, int layer, int kv_head, std::span<const int32_t> kept) override;
  void on_sequence_end(int32_t seq) override;
  // The prompt method's choices may span the ranks' heads (ChunkKV's chunks): it joins the same ranks.
  void set_communicator(Communicator& comm) override;
  // The prompt method's (this method keeps nothing the retained KV does not hold).
  std::unique_ptr<MethodSequenceState> export_sequence_state(int32_t seq) override;
  Status import_sequence_state(int32_t seq, std::unique_ptr<MethodSequenceState> state) override;
  // {"uncompressed_from": position, "compressions": count, "last_region": [first, end) positions of the last
  // compression, "last_kept": [layer][kv_head] -> the region-relative indices select() kept there (all of them
  // where the whole region stayed; none on sliding-window layers), "last_scores": [layer][kv_head] -> the scores
  // it chose them by (none where nothing was scored)}, or null for a sequence that has not decoded.
  nlohmann::json debug_state(int32_t seq) const override;

 protected:
  // `config` is the method's own resolved one; `prompt_method` (or null) the prompt-time method it composes with.
  DecodeCompressionMethod(std::string name, nlohmann::ordered_json config, int32_t query_capacity,
                          std::unique_ptr<MethodRuntime> prompt_method);

  struct Clock {
    int32_t num_decoded = 0;             // decode tokens of the sequence so far, this step's included
    int32_t num_generated_resident = 0;  // tokens at positions >= the prompt's end a full-attention stream holds
    int32_t num_logical = 0;             // the sequence's logical length
    int32_t uncompressed_from = 0;       // position after the last compressed region (the prompt's end at first)
  };
  struct Region {
    int32_t first = 0;  // positions [first, end) are rescored
    int32_t end = 0;
    int32_t num_queries = 0;  // the newest decode queries that score them (<= the ring's capacity)
  };
  virtual std::optional<Region> plan_compression(const Clock& clock) const = 0;
  // How many scores per KV head score() gives a region of n tokens.
  virtual int32_t num_scores(int32_t n) const = 0;
  // Enqueues one layer's scores of a region of n tokens through backend ops where the tensors live: out
  // [Hkv, num_scores(n)]; queries [num_queries, H, D] oldest first and keys [n, Hkv, D] in position order, F32. A
  // head's scores read only its keys and its query group's queries (so tensor-parallel ranks choose for their heads
  // alone).
  virtual void score(TensorView out, TensorView queries, TensorView keys) = 0;
  // The ascending region-relative indices one KV head keeps of the region's n tokens, from its scores
  // [num_scores(n)] in host memory. Called from several threads at once.
  virtual std::vector<int32_t> select(const float* scores, int32_t n) const = 0;
  // How many of a region of n tokens select() keeps (what sliding-window layers keep of it as a tail); a region
  // that keeps all n is not scored.
  virtual int32_t num_kept(int32_t n) const = 0;
  // The most generated tokens resident at once (before a compression step compacts them) up to `num_decoded`
  // decoded tokens.
  virtual int32_t peak_generated_tokens(int32_t num_decoded) const = 0;

 private:
  struct SequenceState {
    RecentQueries queries;
    int32_t prompt_end = 0;  // the num_prefill_tokens its generated part follows
    int32_t uncompressed_from = 0;
    int32_t num_compressions = 0;
    std::pair<int32_t, int32_t> last_region{0, 0};
    std::vector<std::vector<int32_t>> last_kept;  // [stream] region-relative indices kept in the last region
    std::vector<std::vector<float>> last_scores;  // [stream] the scores they were chosen by
  };
  // One sequence a step compresses: positions region [first, end), and per layer the region's slots [first_slot,
  // first_slot + count) (the same in every KV head of a full-attention layer) and, where a full-attention layer
  // does not keep the whole region, where its scores start in scores_ (else -1).
  struct Compression {
    int32_t seq = 0;
    SequenceState* state = nullptr;
    Region region;
    std::vector<int32_t> first_slot, count;
    std::vector<int64_t> score_offset;
  };
  // The state of a sequence decoding in this step: created (with rings) at its first decode step, and created anew
  // when it took more prompt since it last decoded.
  SequenceState& decoding_state(const StepContext& ctx, const SequenceSlice& slice);
  // Ends a sequence's state, its query rings kept for the next sequence.
  void end_sequence(std::unordered_map<int32_t, SequenceState>::iterator it);
  // The region's slots per layer, and its scores' place from `num_scores_total` on (which it advances).
  void place_scores(StepContext& ctx, Compression& c, int64_t& num_scores_total) const;
  // Enqueues every scored layer's gather and scores of `c` into `scores`.
  void enqueue_scores(StepContext& ctx, const Compression& c, TensorView scores);
  // Scores `compressions` (placed from 0 to num_scores_total), copies the scores to the host once, then evicts.
  void score_and_evict(StepContext& ctx, std::span<const Compression> compressions, int64_t num_scores_total);
  // Chooses the kept tokens of `c` from host_scores_ and evicts the rest.
  void evict_unkept(StepContext& ctx, const Compression& c);

  std::unique_ptr<MethodRuntime> prompt_method_;  // null: the prompt stays whole
  int32_t query_capacity_ = 0;
  std::unordered_map<int32_t, SequenceState> sequences_;  // by sequence id, from its first decode step
  std::vector<Tensor> spare_rings_;                       // ended sequences' RecentQueries storage, for the next ones
  // The forwards' query rows, as on_attention_end last saw them: what a ring holds and where.
  int64_t query_row_elements_ = 0;
  Device query_device_ = Device::kCpu;
  // The step's query rows into the rings (layer 0's places, ring_layer_stride_ apart from each next layer's):
  // built on the host and uploaded to step_table_, where on_attention_end's scatters read them; num_step_rows_ 0
  // outside a step's forward.
  std::vector<RowDestination> step_rows_;
  StagedBuffer step_table_;
  int64_t num_step_rows_ = 0;
  int64_t ring_layer_stride_ = 0;
  // Scratch of finish_step: the step's compressions, per stream the kept slots, and a region's keys and queries
  // and every compression's scores where the pool lives, and the scores' host copy.
  std::vector<Compression> compressions_;
  std::vector<std::vector<int32_t>> kept_;
  std::vector<KvStreams::StreamEviction> evictions_;
  Tensor keys_, queries_, scores_;
  std::vector<float> host_scores_;
};

}  // namespace se
