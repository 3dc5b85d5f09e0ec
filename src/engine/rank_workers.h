// RankWorkers: one thread for each tensor-parallel rank but rank 0, running that rank's part of every step. The
// engine thread hands every worker the step's plan (start), runs rank 0's part itself, and waits for the workers
// (finish) before it changes any request or cache, so the plan's requests stay as the workers read them. Between
// steps the workers wait: the engine thread may then touch their ranks' caches (the hand-over orders it with their
// steps). Every step a worker runs is a collective its rank joins, so no rank may skip one. Engine thread only.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/model_runner.h"

namespace se {

class RankWorkers {
 public:
  // One worker per runner (ranks 1 .. size - 1, in order); none for an unsharded engine.
  explicit RankWorkers(std::vector<ModelRunner*> runners);
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;
  ~RankWorkers();  // joins the workers (call between steps)

  // Every worker starts following `plan` (ModelRunner::follow), which must stay alive until finish() returns.
  void start(const StepPlan& plan);
  // Returns once every worker has finished the plan start() gave it.
  void finish();

 private:
  void work(ModelRunner& runner);

  std::vector<ModelRunner*> runners_;
  std::mutex mutex_;
  std::condition_variable step_ready_;
  std::condition_variable step_done_;
  const StepPlan* plan_ = nullptr;
  uint64_t num_steps_ = 0;    // steps started so far: a worker follows each once
  size_t num_following_ = 0;  // workers still on the current step
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace se
