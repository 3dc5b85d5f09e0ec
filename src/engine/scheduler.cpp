#include "engine/scheduler.h"

#include <algorithm>

#include "base/check.h"

namespace se {

void Scheduler::add(Request* request) { waiting_.push_back(request); }

void Scheduler::preempt(Request* request, StepPlan& plan) {
  oracle_.preempt(*request);
  request->state = RequestState::kWaiting;
  ++request->num_preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), request));
  waiting_.push_front(request);
  plan.preempted.push_back(request);
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int32_t budget = config_.max_num_batched_tokens;
  oracle_.begin_step();

  // Running requests keep their place; memory for them comes first, by preempting the newest if needed.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* request = running_[i];
    const int32_t n = std::min(request->num_uncomputed_tokens(), budget);
    SE_CHECK(n > 0, "running request {} has nothing to compute", request->request_id);
    bool scheduled = false;
    while (true) {
      if (oracle_.try_reserve(*request, n)) {
        scheduled = true;
        break;
      }
      Request* victim = running_.back();
      preempt(victim, plan);
      if (victim == request) break;
    }
    if (!scheduled) continue;  // `request` itself was preempted; running_[i] is now the next one
    plan.scheduled.push_back({request, n});
    budget -= n;
    ++i;
  }

  // Waiting requests in arrival order, only while they fit without preempting anyone.
  while (plan.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Request* request = waiting_.front();
    if (config_.admission == Admission::kPeak && !oracle_.fits_at_peak(running_, *request)) break;
    if (request->seq < 0 && !oracle_.admit(*request).is_ok()) break;
    const int32_t n = std::min(request->num_uncomputed_tokens(), budget);
    if (!oracle_.try_reserve(*request, n)) {
      oracle_.preempt(*request);  // gives back its prefix pins (or keeps its state); it is admitted again next time
      break;
    }
    waiting_.pop_front();
    request->state = RequestState::kRunning;
    running_.push_back(request);
    plan.scheduled.push_back({request, n});
    budget -= n;
  }
  plan.num_scheduled_tokens = config_.max_num_batched_tokens - budget;
  return plan;
}

void Scheduler::remove_finished() {
  std::erase_if(running_, [](const Request* r) { return r->state == RequestState::kFinished; });
}

void Scheduler::remove(Request* request) {
  std::erase(running_, request);
  std::erase(waiting_, request);
}

}  // namespace se
