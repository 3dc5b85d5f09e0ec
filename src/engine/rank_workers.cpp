#include "engine/rank_workers.h"

namespace se {

RankWorkers::RankWorkers(std::vector<ModelRunner*> runners) : runners_(std::move(runners)) {
  threads_.reserve(runners_.size());
  for (ModelRunner* runner : runners_) threads_.emplace_back([this, runner] { work(*runner); });
}

RankWorkers::~RankWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  step_ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void RankWorkers::start(const StepPlan& plan) {
  if (runners_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    plan_ = &plan;
    ++num_steps_;
    num_following_ = runners_.size();
  }
  step_ready_.notify_all();
}

void RankWorkers::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  step_done_.wait(lock, [this] { return num_following_ == 0; });
}

void RankWorkers::work(ModelRunner& runner) {
  uint64_t num_followed = 0;
  while (true) {
    const StepPlan* plan = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      step_ready_.wait(lock, [&] { return stop_ || num_steps_ != num_followed; });
      if (stop_) return;
      num_followed = num_steps_;
      plan = plan_;
    }
    runner.follow(*plan);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--num_following_ == 0) step_done_.notify_one();
    }
  }
}

}  // namespace se
