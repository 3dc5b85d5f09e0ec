// GenerationSession: the engine requests behind one HTTP request, one per choice (n), and their output streams.
// Destroying the session aborts the choices still running, so a client that goes away frees its KV pages at the
// engine's next step. Used by one HTTP thread at a time; not thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace se::server {

struct ChoiceDelta {
  int index = 0;  // which choice
  RequestOutput output;
};

class GenerationSession {
 public:
  // Submits `n` requests "<id>-<i>" with the same prompt; choice i samples with seed + i when a seed is set, so
  // choices differ yet stay reproducible. On an error nothing stays queued. A chain request has n = 1.
  static Result<std::unique_ptr<GenerationSession>> submit(Engine& engine, const std::string& id,
                                                           const std::vector<int32_t>& prompt_ids,
                                                           const SamplingParams& params, int n,
                                                           std::optional<ChainRequest> chain = std::nullopt);
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  int num_choices() const { return static_cast<int>(streams_.size()); }
  // The next delta of any unfinished choice, waiting at most `timeout`; nullopt on timeout or when all finished.
  std::optional<ChoiceDelta> next(std::chrono::milliseconds timeout);
  bool finished() const { return num_unfinished_ == 0; }

 private:
  explicit GenerationSession(Engine& engine) : engine_(engine) {}

  Engine& engine_;
  std::vector<std::string> request_ids_;
  std::vector<std::shared_ptr<OutputStream>> streams_;
  std::vector<bool> done_;
  int num_unfinished_ = 0;
  size_t cursor_ = 0;  // round-robin start, so one busy choice cannot starve the others
};

}  // namespace se::server
