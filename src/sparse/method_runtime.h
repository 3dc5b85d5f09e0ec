// MethodRuntime: one sparse method (or `vanilla`) at run time. The SparseController calls its hooks at the
// model's module boundaries; the method decides what attention reads (selection), what stays resident
// (eviction through its cache's KvStreams) and what it remembers (per-sequence metadata). It declares its traits and
// answers how many pages a sequence needs, so the scheduler can plan without knowing which method runs.
//
// Hook order in one step (sparse_controller.h): prepare_step; then per layer, in layer order: write of the new
// K/V, build_layer_selection (by default build_prefill_selection / build_decode_selection per sequence of that
// kind), attention, on_attention_end, on_layer_end; after sampling, finish_step. Hooks see only the step's
// sequences.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "loader/kv_cache_scales.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "parallel/communicator.h"
#include "sparse/cache_manager.h"
#include "sparse/method_traits.h"
#include "sparse/partition_config.h"
#include "sparse/selection.h"

namespace se {

class LowRankKv;

// Runs one extra forward of `token_ids` for sequence `seq` on top of its cache and drops their K/V again
// (SparseController::run_transient_pass). The model's per-layer hooks fire for it; prepare_step and finish_step
// do not.
using TransientPassFn = std::function<Status(int32_t seq, std::span<const int32_t> token_ids)>;

// A sequence's method metadata taken out of the method, so Chain Cache can keep it between turns (e.g. accumulated
// attention scores). Each method defines its own.
class MethodSequenceState {
 public:
  virtual ~MethodSequenceState() = default;
};

struct StepContext {
  const ForwardBatch& batch;
  KvStreams& cache;
  // Set in finish_step when the driver can run model forwards (ModelRunner, the fidelity tool); empty
  // otherwise, and always empty in prepare_step and inside a transient pass.
  TransientPassFn run_transient_pass;
  // Each layer's sliding window as attention last applied it (0 = full attention); empty before the first
  // forward.
  std::span<const int32_t> layer_windows;

  int32_t sliding_window(int layer) const {
    return layer < static_cast<int>(layer_windows.size()) ? layer_windows[static_cast<size_t>(layer)] : 0;
  }
};

// One layer of one step. q, k, v are the batch's new rows after RoPE (q [T, H, D], k/v [T, Hkv, D]); `view` is
// the dense view of the layer with the new K/V already stored; `out` [T, H, D] holds attention's output once
// on_attention_end runs. `kernel_view` is the same view with its tables where the pool lives (the device mirror
// on a GPU, `view` itself on the CPU): ops that read it enqueue no host copy.
struct LayerContext {
  int layer = 0;
  const LayerConfig& layer_config;
  const ForwardBatch& batch;
  TensorView q, k, v, out;
  const AttentionView& view;
  const AttentionView& kernel_view;
  const AttentionParams& params;
  KvStreams& cache;

  // The query rows [H, D] of the last token of the batch's sequence `slice`, where q lives.
  TensorView last_query_row(int32_t slice) const {
    const SequenceSlice& s = batch.sequences[static_cast<size_t>(slice)];
    const int64_t row_elements = q.shape[1] * q.shape[2];
    return TensorView{q.ptr<char>() + (s.token_begin + s.num_tokens - 1) * row_elements *
                                          static_cast<int64_t>(dtype_size(q.dtype)),
                      q.dtype, Shape{q.shape[1], q.shape[2]}, q.device};
  }
};

// Where the KV pool comes from, for create_cache.
struct CacheSpec {
  KvLayout layout;
  int32_t num_pages = 0;
  Allocator* allocator = nullptr;
  bool enable_prefix_caching = true;  // what the user asked; a method without full history turns it off
  int32_t num_host_pages = 0;         // the host tier idle state can move to (0: none)
  Allocator* host_allocator = nullptr;  // host memory for it (pinned beside a GPU)
  // The checkpoint's scales of an FP8 store, for the layout's KV heads (none: calibrated on the first batch).
  std::optional<KvCacheScales> fp8_scales = std::nullopt;
  // Set: running sequences live in the host tier and the method's decode runs as Spin's partitions over them
  // (tiered_cache_manager.h), with this buffer; the method's own selection fields (partition_config) come first.
  std::optional<PartitionConfig> partitions = std::nullopt;
  int32_t max_num_batched_tokens = 0;  // a step's tokens at most (the partitions' working set)
};

class MethodRuntime {
 public:
  virtual ~MethodRuntime() = default;

  // Its name in the registry.
  std::string_view name() const { return name_; }
  const MethodTraits& traits() const { return traits_; }
  // The hyperparameters it runs with, defaults filled in.
  const nlohmann::ordered_json& config() const { return config_; }

  // Builds the cache this method keeps its KV in (default: the paged cache, prefix caching only for methods
  // that keep full history).
  virtual Result<std::unique_ptr<CacheManager>> create_cache(const CacheSpec& spec);
  // The factors of the low-rank latents the method keeps instead of K/V, or null for a method over K/V. The
  // engine then keeps a KvStoreKind::kLowRankLatent store of their geometry and the model hands the controller its
  // layer inputs to project (ForwardHooks::attend_low_rank).
  virtual const LowRankKv* low_rank_kv() const { return nullptr; }
  // Bytes of metadata the method keeps per pool page on the pool's device (e.g. key bounds), which the engine
  // sets aside with each page when it sizes the pool.
  virtual size_t page_metadata_bytes(const KvLayout& /*layout*/) const { return 0; }
  // Bytes the method keeps per running sequence on the pool's device outside the pool (e.g. recent query rows), for
  // query rows of `query_row_elements` F32 values; the engine takes them out of the KV budget for every sequence
  // that may run at once, and runs fewer at once when it holds fewer (engine/kv_budget.h).
  virtual int64_t sequence_device_bytes(const KvLayout& /*layout*/, int64_t /*query_row_elements*/) const { return 0; }
  // Bytes the method keeps where the pool lives, beside it, per page of a sequence's KV (a sketch of the keys, e.g.
  // the landmarks of the page's chunks), carried with the sequence's state (export_sequence_state) rather than with
  // the page. The engine counts them in pages' worth: beside each page when it sizes a resident pool, and as metadata
  // pages a sequence holds as it grows when its KV lives on the host tier (PartitionConfig::state_bytes_per_page).
  virtual int64_t state_bytes_per_page(const KvLayout& /*layout*/) const { return 0; }
  // The method's decode as Spin's partitions over KV on the host tier (partitioned_decode.h): its selection
  // (a page budget, group reduction and dense layers, or token filters) with the default buffer; nullopt
  // for a method that cannot run so.
  virtual std::optional<PartitionConfig> partition_config() const { return std::nullopt; }
  // Fills in what partition_config depends on the model for (its `num_layers` layers).
  virtual void complete_partition_config(PartitionConfig& /*config*/, int32_t /*num_layers*/) const {}

  // --- memory (MemoryOracle) ---
  // Pages a sequence holds once it has computed `num_tokens` tokens of which `num_prefill_tokens` were
  // prefilled, after the method's compression (default: every token resident).
  virtual int64_t resident_pages(const KvLayout& layout, int32_t num_prefill_tokens, int32_t num_tokens) const;
  // The most pages a request can hold at once: the uncompressed prefill plus the tokens of its transient
  // passes (the peak before compression) or its compressed size at the end of generation, whichever is larger.
  int64_t peak_pages(const KvLayout& layout, int32_t num_prompt_tokens, int32_t max_new_tokens) const;
  // Tokens the method's transient passes (StepContext::run_transient_pass) add on top of a sequence's full
  // cache at most, right after a prefill of `num_prefill_tokens` tokens (default: none). The MemoryOracle
  // keeps that much room free in the step that completes the prefill.
  virtual int32_t transient_extra_tokens(int32_t /*num_prefill_tokens*/) const { return 0; }

  // --- hooks ---
  virtual void prepare_step(StepContext& /*ctx*/) {}
  // Narrow what attention reads in one layer for every sequence of the batch. The default asks the per-sequence
  // hooks below; a method that ranks the whole batch in one op overrides this instead.
  virtual void build_layer_selection(LayerContext& ctx, Selection& selection);
  // Narrow what attention reads for batch sequence `slice` (an index into ctx.batch.sequences).
  virtual void build_prefill_selection(LayerContext& /*ctx*/, int32_t /*slice*/, Selection& /*selection*/) {}
  virtual void build_decode_selection(LayerContext& /*ctx*/, int32_t /*slice*/, Selection& /*selection*/) {}
  // What the last query row of decode sequence `slice` of `view` reads in layer `layer` (a `sliding_window` of 0 =
  // none) under the method's selection: KV tokens over all KV heads (nullopt when the method leaves the layer
  // dense) and bytes of its per-page metadata (page_metadata_bytes, e.g. key bounds). It counts toward the step's
  // roofline, and is all that counts the reads of a decode forward replayed without its hooks
  // (MethodTraits::static_decode_forward). A method whose decode buffers move calls
  // StepGraph::note_buffers_moved, so no stale replay runs.
  struct DecodeReads {
    std::optional<int64_t> kv_tokens;
    int64_t metadata_bytes = 0;
  };
  virtual DecodeReads decode_reads(int /*layer*/, int32_t /*sliding_window*/, const AttentionView& /*view*/,
                                   int32_t /*slice*/) const {
    return {};
  }
  virtual void on_attention_end(LayerContext& /*ctx*/) {}
  virtual void on_layer_end(int /*layer*/, const ForwardBatch& /*batch*/, TensorView /*hidden*/) {}
  virtual void finish_step(StepContext& /*ctx*/) {}
  // Pages changed outside a forward: prefix pruning rewrote them, or a prefix-cache hit brought them back from the
  // host tier under new ids; `view`'s new rows are their tokens, in layer `layer`. Methods with per-page metadata
  // (page_metadata_bytes) recompute it for those pages.
  virtual void on_pages_rewritten(int /*layer*/, const AttentionView& /*view*/) {}
  // Stream (layer, kv_head) of `seq` was compacted from outside the method (a Chain Cache prune) to its slots
  // `kept` (ascending): methods that keep metadata per slot compact it alike.
  virtual void on_stream_compacted(int32_t /*seq*/, int /*layer*/, int /*kv_head*/,
                                   std::span<const int32_t> /*kept*/) {}
  // The sequence left the cache (finished, aborted, preempted): drop what the method keeps for it.
  virtual void on_sequence_end(int32_t /*seq*/) {}
  // --- Chain Cache: metadata that must outlive the sequence with its retained KV ---
  // Takes what the method keeps for `seq` between steps out of the method (called when a finished turn is
  // retained, before on_sequence_end); null for methods whose state lives in the KV alone.
  virtual std::unique_ptr<MethodSequenceState> export_sequence_state(int32_t /*seq*/) { return nullptr; }
  // Gives a state export_sequence_state returned (possibly null) to sequence `seq`, restored from the same turn.
  virtual Status import_sequence_state(int32_t seq, std::unique_ptr<MethodSequenceState> state) {
    if (state) return invalid_argument("{} keeps no per-sequence state to import for sequence {}", name(), seq);
    return Status::ok();
  }

  // --- tensor parallelism (MethodTraits::tensor_parallel) ---
  // This instance serves rank comm.rank() of comm.size(), over that rank's KV heads; set before the first step.
  // Hooks that must agree across ranks run their collectives on it, every rank in the same order. A method that
  // composes another hands it on.
  virtual void set_communicator(Communicator& comm) { communicator_ = &comm; }
  // The ranks this instance's decisions must agree with (a single rank unless set_communicator said otherwise).
  Communicator& communicator() const { return *communicator_; }

  // --- introspection (tests and debugging only; never read by the engine) ---
  // The method's per-sequence metadata for `seq` as JSON (e.g. accumulated attention scores), so fidelity tests can
  // compare it with an oracle; null when the method keeps none.
  virtual nlohmann::json debug_state(int32_t /*seq*/) const { return {}; }

 protected:
  MethodRuntime(std::string name, nlohmann::ordered_json config) : name_(std::move(name)), config_(std::move(config)) {}

  MethodTraits traits_;  // each method fills its own in its constructor

 private:
  Communicator* communicator_ = &single_rank_communicator();
  std::string name_;
  nlohmann::ordered_json config_;
};

}  // namespace se
