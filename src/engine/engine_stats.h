// EngineStats: counters and histograms the engine keeps for /metrics (Prometheus) and logs. Plain data; the
// engine publishes a copy under a lock after every step.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <vector>

namespace se {

// Cumulative histogram with fixed upper bounds, in seconds.
struct LatencyHistogram {
  std::vector<double> bounds;   // upper bounds, ascending; +Inf is implied
  std::vector<uint64_t> counts; // per bucket (not cumulative), size bounds.size() + 1
  double sum = 0.0;
  uint64_t count = 0;

  explicit LatencyHistogram(std::vector<double> upper_bounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                                 1.0, 2.5, 5.0, 10.0, 30.0, 60.0})
      : bounds(std::move(upper_bounds)), counts(bounds.size() + 1, 0) {}
  void observe(double seconds);
};

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  int num_prefilling = 0;  // running requests whose prompt is not all in the cache yet
  int64_t num_kv_pages_total = 0;
  int64_t num_kv_pages_used = 0;    // held by live requests
  int64_t num_kv_pages_free = 0;    // in the pool's free list
  int64_t num_kv_pages_cached = 0;  // held only by the idle prefix cache (reclaimable)
  int64_t num_kv_pages_chains = 0;  // held by idle Chain Cache chains (reclaimable); total = the four
  // The most pages live sequences and idle chains held at once, at a step's peak (before its compressions).
  int64_t num_kv_pages_used_peak = 0;
  int num_chains = 0;                       // Chain Cache chains, idle or with a turn in flight
  int64_t num_kv_host_pages_total = 0;      // the host tier's pages (--kv-offloading-size; 0 without one)
  int64_t num_kv_host_pages_used = 0;       // held there by offloaded state
  int64_t num_kv_host_pages_used_peak = 0;  // the most it held when a step ended
  int num_chains_on_host = 0;               // idle chains whose state is on the host tier
  uint64_t prompt_tokens_total = 0;
  uint64_t generation_tokens_total = 0;
  uint64_t prefix_cache_queries_total = 0;  // prompt tokens looked up
  uint64_t prefix_cache_hits_total = 0;     // prompt tokens found cached
  uint64_t requests_finished_total = 0;
  uint64_t requests_aborted_total = 0;
  uint64_t preemptions_total = 0;
  uint64_t transient_pass_tokens_total = 0;  // tokens methods ran in transient passes (context reconstruction)
  uint64_t steps_total = 0;                  // model forwards of the serving loop
  // The method's compressions and evictions (SparseController::num_compression_steps): steps that returned pages
  // to the pool, the pages returned, and the time its end-of-step work took in all steps.
  uint64_t compression_steps_total = 0;
  uint64_t compression_freed_pages_total = 0;
  double compression_seconds_total = 0.0;
  // KV tokens attention read: per step, layer, sequence and KV head, what its last query row sees (after
  // selection, eviction and sliding windows). Decode steps read each of them once, so this is their KV traffic.
  uint64_t attended_kv_tokens_total = 0;
  // Bytes of per-page method metadata decode selections read (e.g. per-page key bounds), on top of that KV.
  uint64_t method_metadata_bytes_total = 0;
  // Bytes of expert weights MoE layers read (ModelRunner::expert_weight_bytes): the experts the batch chose.
  uint64_t expert_weight_bytes_total = 0;
  // Decode time the device waited for the host between graph-replayed steps (ModelRunner::host_gap_seconds).
  double host_gap_seconds_total = 0.0;
  std::chrono::steady_clock::time_point published_at;  // when this snapshot was taken (right after a step)
  LatencyHistogram time_to_first_token;
  LatencyHistogram inter_token_latency;
  LatencyHistogram e2e_request_latency;
};

}  // namespace se
