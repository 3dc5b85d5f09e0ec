// Engine: the serving core. One thread (the engine loop) owns the model and all cache state; other threads
// submit requests and read their OutputStreams. Each step the scheduler picks {request -> num_tokens} within
// the token budget, the model runs one mixed prefill/decode forward over paged KV, the sampler picks the next
// tokens, and finished requests release their pages. submit() and abort() are thread-safe and never block on a
// running step.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "engine/engine_stats.h"
#include "engine/prefix_prune_job.h"
#include "engine/model_bundle.h"
#include "engine/request_output.h"
#include "engine/sampling_params.h"
#include "kv/chain_cache.h"
#include "sparse/method_environment.h"
#include "sparse/method_runtime.h"

namespace se {

// A request's Chain Cache part: start chain `chain_id` (create), or continue it, resuming from the state its
// last turn left when `prompt_ids` extend that turn's tokens.
struct ChainRequest {
  std::string chain_id;
  bool create = false;
};

struct GenerationRequest {
  std::string request_id;          // unique among live requests; abort() names it
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  std::optional<ChainRequest> chain;
};

// What the radix prefix cache holds for a token sequence.
struct PrefixCacheInspection {
  int32_t num_cached_tokens = 0;    // logical tokens of the longest cached prefix (whole blocks)
  int32_t num_resident_tokens = 0;  // of those, tokens whose KV is held (a pruned segment's dropped ones are not)
  std::vector<TokenRange> pruned_segments;  // the pruned segments inside it, in order
};

class EngineLoop;

// The model as sparse methods see it (sparse/method_environment.h): `bundle`'s tokenizer and chat reply suffix.
// The engine builds its method with it; so does anything that builds methods for the same model
// (TeacherForcedSequence). `bundle` must outlive the environment.
MethodEnvironment method_environment(const ModelBundle& bundle);

// Ok when `config` can run `method`'s decode as Spin's partitions over the host tier (or does not ask to, and the
// method sets nothing that only they run, as a two-level page ranking): kInvalidArgument / kUnimplemented naming
// what stands in the way. Needs no model, so the command line checks it before one loads.
Status check_kv_partitions(const EngineConfig& config, const MethodRuntime& method);

// The partitions' settings the engine's cache runs with under `config` (check_kv_partitions ok, kv_partitions set):
// the method's selection over `layout`, and the buffer config gives. kInvalidArgument for a fixed buffer smaller
// than one layer's selection, kUnimplemented for the two-level ranking over pages other than fp32.
Result<PartitionConfig> engine_partition_config(const EngineConfig& config, MethodRuntime& method,
                                                const KvLayout& layout);

class Engine {
 public:
  // Sizes the KV pool from `config` and starts the engine thread. `bundle` must outlive the engine.
  static Result<std::unique_ptr<Engine>> create(const ModelBundle& bundle, const EngineConfig& config);
  ~Engine();  // aborts what is in flight and joins the thread

  // Validates and queues a request. Errors (nothing queued): invalid params, empty prompt, token ids out of
  // range, prompt + max_tokens over max_model_len (kOutOfRange), a request that could never fit in the KV pool
  // (kResourceExhausted), a duplicate request_id, or the engine shutting down (kUnavailable). With a chain:
  // kInvalidArgument when the engine runs without Chain Cache, ChainCacheIndex::begin_turn's errors (kNotFound,
  // kGone, kConflict for a busy chain or a prompt that does not extend it), and kUnavailable when the retained
  // state plus the new tokens could never fit (the chain stays as it was).
  Result<std::shared_ptr<OutputStream>> submit(GenerationRequest request);
  // Queues every request of `batch` at once, so the first step already sees them all (as an offline batch
  // expects, and a reproducible schedule needs), or none of them: submit's errors for the first request that
  // fails, a duplicate id inside the batch included. Chain turns go through submit.
  Result<std::vector<std::shared_ptr<OutputStream>>> submit_batch(std::vector<GenerationRequest> batch);

  // Aborts a live request: its stream ends with FinishReason::kAbort and its pages are freed at the next step
  // boundary. Unknown ids are ignored.
  void abort(const std::string& request_id);

  // Stops admitting; with `drain`, lets running and waiting requests finish first, else aborts them. Blocks
  // until the engine thread exits.
  void shutdown(bool drain);

  // A consistent snapshot for /metrics and logs.
  EngineStats stats() const;
  // What the Chain Cache holds for `chain_id` (nullopt: unknown, reclaimed, or the Chain Cache is off).
  std::optional<ChainInfo> find_chain(const std::string& chain_id) const;
  // The tokens an idle chain's state stands for (empty: unknown, busy, reclaimed, or no Chain Cache).
  std::vector<int32_t> chain_prefix(const std::string& chain_id) const;
  // The settings this engine's chain states depend on (model, KV layout and store, method and its config), which a
  // turn must match to resume a chain; empty without the Chain Cache.
  const std::string& chain_fingerprint() const;

  // --- prefix pruning and inspection (the radix prefix cache; its tree belongs to the engine thread) ---
  // Queues a prune (validate_prune_request's errors; kUnavailable while shutting down) and returns its id; the
  // engine thread runs it between steps.
  Result<std::string> submit_prune(PruneRequest request);
  // The prune's status (queued, completed, blocked or failed), or nullopt for an unknown or forgotten id.
  std::optional<PruneStatus> prune_status(const std::string& prune_id) const;
  // What the cache holds for `tokens`: every whole block, or with `as_prompt` what a request with that prompt
  // would reuse (its last token is always computed). Waits for the engine thread (one step at most).
  // kUnimplemented without a radix prefix cache; kUnavailable while shutting down.
  Result<PrefixCacheInspection> inspect_prefix(std::vector<int32_t> tokens, bool as_prompt);

  const ModelBundle& bundle() const;
  const EngineConfig& config() const;

 private:
  explicit Engine(std::unique_ptr<EngineLoop> loop);
  std::unique_ptr<EngineLoop> loop_;
};

}  // namespace se
