// Scheduler: continuous batching. Each step it hands out plain data, {request -> num_tokens}, within the
// per-step token budget and max_num_seqs: running requests first (one decode token, or the next prefill chunk),
// then waiting requests in arrival order while memory allows (SchedulerConfig::admission says how much must be
// free). A step may mix decode tokens and prefill chunks.
// When a running request cannot get memory, the most recently arrived running request is preempted (its cache
// released and recomputed later, or, where running sequences live in the host tier, kept there and resumed;
// its outputs kept: MemoryOracle::preempt). It sees memory only through the MemoryOracle and never
// touches tensors. Engine thread only.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "engine/admission.h"
#include "engine/memory_oracle.h"
#include "engine/request.h"

namespace se {

struct ScheduledRequest {
  Request* request = nullptr;
  int32_t num_tokens = 0;  // tokens computed for it this step, starting at its num_computed_tokens
};

struct StepPlan {
  std::vector<ScheduledRequest> scheduled;
  std::vector<Request*> preempted;  // moved back to waiting during this step's scheduling
  int32_t num_scheduled_tokens = 0;
  bool empty() const { return scheduled.empty(); }
};

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  Admission admission = Admission::kOptimistic;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, MemoryOracle& oracle) : config_(config), oracle_(oracle) {}

  void add(Request* request);  // queues at the back of the waiting line
  StepPlan schedule();
  // After the step: removes finished requests from the running set.
  void remove_finished();
  // Drops a request wherever it is (abort); the caller releases its memory.
  void remove(Request* request);

  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }

 private:
  void preempt(Request* request, StepPlan& plan);

  SchedulerConfig config_;
  MemoryOracle& oracle_;
  std::vector<Request*> running_;  // in admission order: the back is preempted first
  std::deque<Request*> waiting_;   // preempted requests return to the front
};

}  // namespace se
