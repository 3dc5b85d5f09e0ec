// SparseController: the model's ForwardHooks, turned into the active method's lifecycle. At every layer it
// stores the new K/V through the method's CacheManager, lets the method narrow what each sequence's attention
// reads, runs attention over the resulting AttentionView and hands the method the outcome; around the forward
// it fires prepare_step and finish_step. Model code and the scheduler only ever talk to this class, never to a
// method by name. On CUDA the methods still see the cache's host views while write_kv and attention read their
// device mirror, uploaded once per forward. A cache whose running sequences live partly on the host tier
// (TieredCacheManager) attends itself, sequence by sequence, through Spin's partitions; the method's per-layer hooks
// then do not run, but for a method that selects its tokens itself (PartitionConfig::method_tokens): its decode
// selection names each sequence's tokens, and its on_attention_end sees each prefill chunk's sequence alone, its
// layer whole and resident. Engine thread only.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "model/forward_hooks.h"
#include "sparse/attention_view_mirror.h"
#include "sparse/method_runtime.h"
#include "sparse/retained_sequence.h"
#include "sparse/tiered_cache_manager.h"

namespace se {

class SparseController final : public ForwardHooks {
 public:
  // `device` is where the model runs and the cache's pages live.
  SparseController(MethodRuntime& method, CacheManager& cache, Device device = Device::kCpu)
      : method_(method),
        cache_(cache),
        device_(device),
        tiered_(dynamic_cast<TieredCacheManager*>(&cache)),
        device_views_(device == Device::kCpu ? nullptr : std::make_unique<AttentionViewMirror>(device)) {}

  MethodRuntime& method() { return method_; }

  bool stores_latent() const override { return cache_.layout().shared_latent(); }
  // A shared-latent store (the engine picks it for methods that keep one, keeps_shared_latent): the rows are written
  // and the method sees the layer as multi-query attention of one latent "KV head", q the absorbed queries and k
  // and v the latent rows, whose products are the model's logits; it selects and scores there, and the selection
  // is attended with the weights absorbed.
  void attend_latent(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q_latent,
                     TensorView latent, TensorView kv_b, TensorView out, const AttentionParams& params) override;
  bool stores_low_rank() const override { return cache_.layout().low_rank_latent(); }
  // A low-rank latent store (the method's MethodRuntime::low_rank_kv): the layer input is projected to the latent
  // rows, which are written, and attention rebuilds keys and values from them (paged_low_rank_attention). The method
  // sees the stored rows as k and v.
  void attend_low_rank(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q,
                       TensorView x, TensorView out, const AttentionParams& params) override;
  CacheManager& cache() { return cache_; }
  const CacheManager& cache() const { return cache_; }

  // Before and after one step's forward (after = after sampling).
  void prepare_step(const ForwardBatch& batch);
  void finish_step(const ForwardBatch& batch);

  // Runs the model's forward over a batch with this controller as its hooks (its logits unused). Whoever drives
  // the model sets it (ModelRunner, the fidelity tool); without it methods get no transient passes.
  using PassForward = std::function<void(const ForwardBatch& batch)>;
  void set_pass_forward(PassForward forward) { pass_forward_ = std::move(forward); }
  // A transient pass, what StepContext::run_transient_pass does in finish_step: reserves `token_ids` on top
  // of sequence `seq`'s cache, runs them through pass_forward as one slice at the positions after its logical
  // length (num_prefill_tokens = 0: neither a prompt chunk nor a decode step; only attend and on_layer_end
  // fire), then truncates the cache back, so the pass leaves no K/V behind. Under tensor parallelism every rank
  // runs the same passes (the forward's collectives pair up) and a pass runs on every rank or on none: the ranks
  // agree over the method's communicator that each could reserve it. Errors: kFailedPrecondition with no pass
  // forward or from inside a pass (no nesting), kResourceExhausted when the pool, or another rank's, cannot hold
  // the tokens (nothing changed).
  Status run_transient_pass(int32_t seq, std::span<const int32_t> token_ids);
  // Tokens run in transient passes so far (a counter for stats).
  int64_t num_transient_pass_tokens() const { return num_transient_pass_tokens_; }
  // KV tokens attention has read, counted per layer, sequence and KV head as what the sequence's last query
  // row sees (EngineStats::attended_kv_tokens_total).
  int64_t num_attended_kv_tokens() const { return num_attended_kv_tokens_; }
  // Bytes of per-page method metadata the decode steps' selections read (MethodRuntime::decode_reads).
  int64_t num_method_metadata_bytes() const { return num_method_metadata_bytes_; }
  // The method's compressions and evictions, all in finish_step: steps whose finish_step returned pages to the
  // pool, the pages it returned, and the time it took (on a GPU, a step that returned pages waits for its
  // compaction kernels before the clock stops, so they count here and not in the next forward).
  int64_t num_compression_steps() const { return num_compression_steps_; }
  int64_t num_compression_freed_pages() const { return num_compression_freed_pages_; }
  double compression_seconds() const { return compression_seconds_; }
  // The most pages live sequences (and idle Chain Cache chains) held at once, counted at each step's peak: after
  // its forward, before finish_step compresses.
  int64_t peak_held_pages() const { return peak_held_pages_; }
  // Counts a forward of `batch` that ran without calling attend (a CUDA graph replay of a static decode step):
  // the tokens the method's selection reads in every layer (MethodRuntime::decode_reads), else the dense tokens,
  // windowed as that layer's last attend was, and the metadata the selection reads.
  void count_replayed_forward(const ForwardBatch& batch);

  // Whether the method's decode forward may replay as a CUDA graph (MethodTraits::static_decode_forward).
  bool decode_forward_is_static() const { return method_.traits().static_decode_forward; }

  // Called in every layer once the method's selection is applied, before attention reads `attended` (its
  // tables on the host; produced lists where the pool lives), so a caller can see what each layer read (the
  // cross-backend fidelity checks). Empty by default.
  using AttentionObserver = std::function<void(const LayerContext& ctx, const AttentionView& attended)>;
  void set_attention_observer(AttentionObserver observer) { attention_observer_ = std::move(observer); }

  void begin_forward(const ForwardBatch& batch) override;
  void attend(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q, TensorView k,
              TensorView v, TensorView out, const AttentionParams& params) override;
  void on_layer_end(int layer, const ForwardBatch& batch, TensorView hidden) override;

  // Sequence lifecycle: the cache's open/close with the method told when a sequence ends, and of cached pages that
  // came back from the host tier under new ids (so per-page metadata is recomputed).
  Result<int32_t> open(int32_t seq, std::span<const int32_t> prompt);
  void close(int32_t seq);
  // Chain Cache: takes sequence `seq` out of the cache and the method (it is closed afterwards) with its method
  // metadata, / opens `seq` on a retained state (a RetainedSequence) and returns its logical length. On error
  // the sequence is not open and the state is destroyed.
  std::unique_ptr<RetainedSequence> retain(int32_t seq);
  Result<int32_t> resume(int32_t seq, std::unique_ptr<ChainState> state);

  // The MemoryOracle's questions that depend on the method.
  int64_t peak_pages(int32_t num_prompt_tokens, int32_t max_new_tokens) const {
    return method_.peak_pages(cache_.layout(), num_prompt_tokens, max_new_tokens);
  }
  // Pages the method's transient passes take on top of a just-prefilled sequence of `num_prefill_tokens`
  // tokens (every stream still holds them all) at most.
  int64_t transient_pages(int32_t num_prefill_tokens) const {
    const KvLayout& l = cache_.layout();
    return l.pages_for_tokens(int64_t{num_prefill_tokens} + method_.transient_extra_tokens(num_prefill_tokens)) -
           l.pages_for_tokens(num_prefill_tokens);
  }

 private:
  // The method's selection for the layer of `ctx`, applied to its view and counted; what attention then reads.
  AttentionView select(LayerContext& ctx);
  // attend over the tiered cache: each sequence of the batch through the partitions, over its own rows.
  void attend_partitioned(int layer, const LayerConfig& layer_config, const ForwardBatch& batch, TensorView q,
                          TensorView k, TensorView v, TensorView out, const AttentionParams& params);
  // PartitionConfig::method_tokens: the method's decode selection of the one sequence of one_sequence_ at `layer`,
  // per KV head, into head_tokens_ (left empty when the method reads the layer whole).
  void select_method_tokens(int layer, const LayerConfig& layer_config, TensorView q, TensorView k, TensorView v,
                            TensorView out, const AttentionParams& params);

  MethodRuntime& method_;
  CacheManager& cache_;
  Device device_;
  TieredCacheManager* tiered_;                         // cache_ when it attends itself; else null
  std::unique_ptr<AttentionViewMirror> device_views_;  // null on the CPU
  Selection selection_;  // reused by every layer
  // method_tokens: the batch narrowed to the sequence the partitions attend (positions whole, so its slice holds;
  // the forward's rows, copied in begin_forward), and that sequence's selected tokens per KV head.
  ForwardBatch one_sequence_;
  std::vector<std::span<const int32_t>> head_tokens_;
  PassForward pass_forward_;
  AttentionObserver attention_observer_;
  ForwardBatch pass_batch_;  // the running transient pass
  bool in_pass_ = false;
  int64_t num_transient_pass_tokens_ = 0;
  int64_t num_attended_kv_tokens_ = 0;
  int64_t num_method_metadata_bytes_ = 0;
  int64_t num_compression_steps_ = 0;
  int64_t num_compression_freed_pages_ = 0;
  double compression_seconds_ = 0.0;
  int64_t peak_held_pages_ = 0;
  std::vector<int32_t> layer_windows_;  // each layer's sliding window at its last attend
  Tensor low_rank_rows_;                // attend_low_rank's latent rows, grown to the largest batch
};

}  // namespace se
