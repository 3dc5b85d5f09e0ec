// kvzip: KVzip (snu-mllab/KVzip `ModelKVzip.self_task` / `scoring`, `KVScore._get_score` / `_threshold`,
// `EvictCache.prune`; kvpress `KVzipPress`). Query-agnostic eviction, once per sequence right after its prompt:
// the model is asked to repeat the prompt, the repeat's attention to each prompt token rates that (layer, KV
// head, token) pair, and one global threshold keeps the best-rated pairs. Engine thread only.
//
// Per sequence whose prefill completes in a step, in finish_step (P = its prefill tokens, C = P - n_sink):
//   1. The first n_sink tokens stand for the system prompt: never evicted, and part of every score's softmax.
//      (The engine has no separate system-prompt range; like kvpress's n_sink = 4 attention sinks. The original
//      excludes the template's system prompt instead; other template tokens are ordinary context here.)
//   2. The context [n_sink, P) is cut into chunks of chunk_size; per chunk i one transient pass
//      (StepContext::run_transient_pass, on top of the full cache, positions after the prompt, K/V dropped
//      afterwards) of the repeat input
//        i == 0: encode("\n\nRepeat the previous context exactly.") + suffix + chunk
//        i >  0: encode("\n\nRepeat the part of the previous context exactly, starting with ")
//                + the last 8 tokens of chunk i-1 + suffix + chunk
//      with suffix = encode(MethodEnvironment::chat_suffix). The strings are the original's (kvpress drops the
//      trailing space of the second).
//   3. In the pass's on_attention_end, per layer: subset_attention_max_scores over [sinks; chunk; repeat keys]
//      gives score[layer][kv_head][chunk token] = max over the group's query heads and the repeat rows of the
//      softmax probability taken over those keys only (fp32 on the CPU; the reference keeps the model dtype).
//   4. After the last chunk, with N = (rated layers) * Hkv * C scores and `ratio` the retained fraction:
//        level "pair" (default): thr = the max(int(N * ratio) - 1, 0)-th largest score (0-based); a pair stays
//          iff score > thr (strict), so heads keep different lengths;
//        level "pair-uniform": every (layer, KV head) keeps its top int(C * ratio) (ties: lower index).
//      Sliding-window layers (window W) are not rated: each of their streams keeps the last
//      min(int(C * ratio), W - 1) context tokens, the ones later queries can still see, and only the sinks the
//      next query still sees (position >= P - W + 1). (Older kept tokens would land inside the layer's window of
//      W physical slots, showing it keys from far outside its trained reach, the sinks above all: on Gemma 3
//      that broke the model. kvpress leaves Gemma 3's sliding layers uncompressed instead.)
//      Each stream is evicted to sinks + its kept context tokens. Decode tokens are never evicted; kept keys
//      keep their RoPE and new tokens their absolute positions.
// ratio = 1 or C <= 0: no passes, nothing evicted. The reference's `head` level (precomputed head scores) is not
// offered.
//
// Tensor parallelism: every rank runs the same passes (their forwards are collectives; SparseController runs a
// pass on every rank or none) and rates its own KV heads with its own query heads; the threshold is the same
// n-th largest of every rank's rated scores, all-gathered (N counts every rank's pairs), so each rank keeps what one
// rank would keep of its heads. Pair-uniform needs no join. A rank's heads may take all N * ratio pairs, which its
// resident_pages allows.
//
// Without a tokenizer in the MethodEnvironment (the fidelity tool, dummy weights) the instruction and suffix
// are empty: the repeat input is the carried 8 tokens and the chunk. Without transient passes (a driver that
// set no pass forward) or when a pass cannot get memory, the prompt stays uncompressed (logged once).
//
// Config (defaults: the original's ratio and level; kvpress's chunk size and sinks):
//   ratio 0.3         retained fraction in [0, 1]
//   chunk_size 2048   context tokens per reconstruction pass (the original uses 2000)
//   n_sink 4          leading tokens never evicted
//   level pair        pair | pair-uniform
// Memory: the peak is the full prompt plus the longest repeat input (transient_extra_tokens); afterwards the
// context pairs kept are at most max(int(N * ratio) - 1, 0), split over streams as the scores fall, so
// resident_pages is the most pages any such split can take. The scores of the last compression stay until the
// sequence's next step (debug_state).
// NOTE: scoring reads the pass's q rows and pages on the host (the CPU subset_attention_max_scores); the CUDA
// path needs a device twin of that op. A pass may exceed --max-num-batched-tokens (chunk_size + the prompt's
// instruction tokens in one forward).
#pragma once

#include <span>
#include <unordered_map>
#include <vector>

#include "sparse/method_config.h"
#include "sparse/method_environment.h"
#include "sparse/method_runtime.h"

namespace se {

class KvzipMethod final : public MethodRuntime {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config,
                                                       const MethodEnvironment& environment);
  // The same, typed, for a reader of last_scores (the kvzip_global prune scorer).
  static Result<std::unique_ptr<KvzipMethod>> make(const nlohmann::json& config, const MethodEnvironment& environment);

  int64_t resident_pages(const KvLayout& layout, int32_t num_prefill_tokens, int32_t num_tokens) const override;
  int32_t transient_extra_tokens(int32_t num_prefill_tokens) const override;

  void prepare_step(StepContext& ctx) override;
  void on_attention_end(LayerContext& ctx) override;
  void finish_step(StepContext& ctx) override;
  void on_sequence_end(int32_t seq) override { sequences_.erase(seq); }
  // {"scores": [layer][kv_head][context token], "threshold": thr (null for pair-uniform), "passes": [repeat
  // input lengths]} of the compression that finished in the sequence's last step; null otherwise.
  nlohmann::json debug_state(int32_t seq) const override;
  // The scores [L][Hkv][C] of the compression that finished in sequence `seq`'s last step (step 3; 0 on
  // sliding-window layers), or empty. What the kvzip_global pruning policy reads.
  std::span<const float> last_scores(int32_t seq) const;

 private:
  struct SequenceState {
    std::vector<int32_t> token_ids;  // the prompt so far (the passes repeat it)
    std::vector<float> scores;       // [L][Hkv][C] once a compression ran (0 on sliding-window layers)
    std::vector<int32_t> windows;    // [L] each layer's sliding window as the passes saw it (0 = full attention)
    int num_layers = 0, num_kv_heads = 0;
    double threshold = 0.0;
    std::vector<int32_t> pass_lengths;
  };
  // The context chunk the running pass repeats.
  struct ActivePass {
    SequenceState* state = nullptr;
    int32_t seq = -1;
    int32_t begin = 0, end = 0;  // token range of the chunk
    int32_t num_context = 0;     // C of the sequence
    int num_scored_layers = 0;
  };

  KvzipMethod(nlohmann::ordered_json config, double ratio, int32_t chunk_size, int32_t num_sink, bool uniform,
              const MethodEnvironment& environment);
  // Runs the passes and evicts; false (nothing evicted) when the prompt stays uncompressed.
  bool compress(StepContext& ctx, int32_t seq, int32_t num_prefill_tokens, SequenceState& state);
  // The repeat input of the chunk [begin, end) of `ids` (the first chunk starts at n_sink).
  std::vector<int32_t> repeat_input(const std::vector<int32_t>& ids, int32_t begin, int32_t end) const;
  // Per (layer, KV head) stream, the ascending context indices (0-based in [0, C)) that stay.
  // The first sink a layer keeps: 0, or on a sliding-window layer the first the next query can see.
  static int32_t first_visible_sink(const SequenceState& state, int layer, int32_t num_prefill_tokens);
  std::vector<std::vector<int32_t>> select(SequenceState& state, int32_t num_context, int num_streams) const;
  // Every tensor-parallel rank's `mine` (as many on each), rank after rank; `mine` itself on one rank.
  std::vector<float> gather_over_every_rank(std::vector<float> mine) const;
  void warn_once(bool& flag, const std::string& message);

  double ratio_ = 0.3;
  int32_t chunk_size_ = 2048;
  int32_t num_sink_ = 4;
  bool uniform_ = false;
  std::vector<int32_t> first_instruction_ids_;  // chunk 0
  std::vector<int32_t> next_instruction_ids_;   // chunks > 0, before the carried tokens
  std::vector<int32_t> suffix_ids_;
  bool has_tokenizer_ = false;
  bool warned_no_tokenizer_ = false, warned_no_passes_ = false, warned_failed_pass_ = false;

  std::unordered_map<int32_t, SequenceState> sequences_;  // by sequence id
  ActivePass active_;
  std::vector<float> chunk_scores_;  // scratch: [Hkv, chunk] of one layer
};

}  // namespace se
