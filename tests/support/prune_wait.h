// Waits for a queued prefix prune (Engine::submit_prune) to end, polling its status; fails the test after a
// minute.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "engine/engine.h"

namespace se::test {

inline PruneStatus wait_for_prune(const Engine& engine, const std::string& prune_id) {
  for (int i = 0; i < 6000; ++i) {
    std::optional<PruneStatus> status = engine.prune_status(prune_id);
    if (status && status->state != PruneState::kQueued) return *status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "prune " << prune_id << " never ended";
  return {};
}

}  // namespace se::test
