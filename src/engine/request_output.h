// What the engine hands back for a request: a stream of RequestOutput deltas (new tokens, new text, logprobs),
// the last one marked finished. OutputStream is the thread-safe queue between the engine thread (producer) and
// one HTTP/CLI thread (consumer).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace se {

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
std::string_view finish_reason_name(FinishReason reason);  // "stop", "length", "abort", "error", ""

// What a request with a chain_id did with its chain: started it, resumed it from the retained state, or
// recomputed its whole context (the restored state was lost to a preemption) and retained that instead.
enum class ChainStatus { kNone, kCreated, kResumed, kRebuilt };
std::string_view chain_status_name(ChainStatus status);  // "created", "resumed", "rebuilt", ""

struct TokenOutput {
  int32_t token_id = 0;
  std::string text;                 // decoded bytes of this token (may be a partial UTF-8 sequence)
  float logprob = 0.0f;             // only meaningful when the request asked for logprobs
  std::vector<TokenLogprob> top;    // top-N alternatives when asked
};

struct RequestOutput {
  std::vector<TokenOutput> tokens;  // tokens generated since the previous delta
  std::string text;                 // text that became final since the previous delta (stop strings applied)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;          // the matched stop string, when one ended the request
  std::string error;                // set with FinishReason::kError
  int num_prompt_tokens = 0;
  int num_cached_tokens = 0;        // prompt tokens served from the prefix cache
  int num_output_tokens = 0;        // total so far
  ChainStatus chain_status = ChainStatus::kNone;  // set on the finished delta of a chain request
};

class OutputStream {
 public:
  void push(RequestOutput output);
  // Blocks until a delta arrives or `timeout` passes (nullopt). Consecutive deltas are merged.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  bool finished() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> queue_;
  bool finished_ = false;
};

}  // namespace se
