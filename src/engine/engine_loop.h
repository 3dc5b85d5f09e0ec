// EngineLoop: the engine thread and its inbox. Other threads hand it new requests and aborts under a mutex;
// the thread owns every Request, the scheduler, the sparse method with its cache manager and the model runner, and is
// the only one that mutates cache state (at step boundaries). After each step it publishes an EngineStats snapshot.
// Tensor parallelism: one loop and one scheduler still decide every step; each rank (EngineRank) holds its part of
// the model, method and cache, rank 0 on the engine thread and the others on RankWorkers, and every rank runs the
// step the scheduler planned. Rank 0 samples; the stats and the prefix cache's answers are rank 0's.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_rank.h"
#include "engine/memory_oracle.h"
#include "engine/model_runner.h"
#include "engine/rank_workers.h"
#include "engine/scheduler.h"

namespace se {

class EngineLoop {
 public:
  // `ranks`: every tensor-parallel rank's part, rank 0's first (one for an unsharded model). `chain_fingerprint`
  // non-empty turns the Chain Cache on, guarding its states with that fingerprint.
  EngineLoop(const ModelBundle& bundle, const EngineConfig& config, std::vector<std::unique_ptr<EngineRank>> ranks,
             std::string chain_fingerprint = {});
  ~EngineLoop();

  Result<std::shared_ptr<OutputStream>> submit(GenerationRequest request);
  Result<std::vector<std::shared_ptr<OutputStream>>> submit_batch(std::vector<GenerationRequest> batch);
  // The Chain Cache, or null when it is off. Thread-safe (chain_cache.h).
  const ChainCacheIndex* chains() const { return chains_.get(); }
  const std::string& chain_fingerprint() const { return chain_fingerprint_; }
  void abort(const std::string& request_id);
  void shutdown(bool drain);
  EngineStats stats() const;
  // Engine::submit_prune, prune_status and inspect_prefix.
  Result<std::string> submit_prune(PruneRequest request);
  std::optional<PruneStatus> prune_status(const std::string& prune_id) const { return prunes_.find(prune_id); }
  Result<PrefixCacheInspection> inspect_prefix(std::vector<int32_t> tokens, bool as_prompt);

  const ModelBundle& bundle() const { return bundle_; }
  const EngineConfig& config() const { return config_; }

 private:
  void run();
  // Validates `g` and builds its request, taking its id and prompt (not its chain).
  Result<std::unique_ptr<Request>> make_request(GenerationRequest& g) const;
  // Queues `job` for the engine thread, which runs it between steps (it may read and change cache state).
  // kUnavailable once the engine stops accepting work.
  Status post(std::function<void()> job);
  // Moves the inbox into the scheduler and applies aborts; returns false when the loop should exit.
  bool take_inbox();
  void step();
  // Appends a sampled token, runs detokenizer and stop checks, and returns the delta to emit.
  RequestOutput accept_token(Request& request, const SampleResult& sample);
  void finish(Request& request, RequestOutput& output, FinishReason reason);
  void abort_request(Request& request);
  // Pins the request's chain (creates it or takes its retained turn), on the submitting thread.
  Status begin_chain_turn(Request& request, const ChainRequest& chain);
  // The request leaves the engine: a finished turn is retained under its chain; a turn that never ran gives its
  // state back; any other end drops the chain.
  void end_chain_turn(Request& request, FinishReason reason);
  void publish_stats();

  // Rank 0's part, which the engine thread runs and reports.
  EngineRank& lead() { return *ranks_[0]; }
  const EngineRank& lead() const { return *ranks_[0]; }

  const ModelBundle& bundle_;
  EngineConfig config_;
  std::vector<std::unique_ptr<EngineRank>> ranks_;
  // After ranks_: destroyed first, while the pools its states hold pages of still exist.
  std::unique_ptr<ChainCacheIndex> chains_;
  std::string chain_fingerprint_;
  MemoryOracle oracle_;
  Scheduler scheduler_;
  RankWorkers workers_;  // ranks 1 .. size - 1

  // Shared with submitting threads, under mutex_.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<std::string> aborts_;
  std::vector<std::function<void()>> jobs_;
  std::unordered_set<std::string> live_ids_;
  bool accepting_ = true;
  bool stop_ = false;
  bool drain_ = false;

  // Engine thread only.
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;

  PruneStatusBoard prunes_;  // thread-safe

  mutable std::mutex stats_mutex_;
  EngineStats stats_;
  EngineStats counters_;  // engine thread's running totals, copied into stats_

  std::thread thread_;
};

}  // namespace se
