// Request: one generation request's state inside the engine: its tokens, progress, sampler, detokenizer and
// stop checker, and the stream its outputs go to. Owned by the engine loop; only the engine thread touches it
// after submission.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/request_output.h"
#include "kv/chain_cache.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "engine/stop_checker.h"
#include "tokenizer/detokenizer.h"

namespace se {

enum class RequestState { kWaiting, kRunning, kFinished };

struct Request {
  using Clock = std::chrono::steady_clock;

  std::string request_id;
  int32_t seq = -1;  // its sequence id in the cache while the request holds cache state
  RequestState state = RequestState::kWaiting;
  std::vector<int32_t> token_ids;    // the prompt, then every generated token
  int32_t num_prompt_tokens = 0;
  SamplingParams params;
  RequestSampler sampler;
  std::optional<IncrementalDetokenizer> detokenizer;
  StopChecker stop_checker;
  std::shared_ptr<OutputStream> stream;

  int32_t num_computed_tokens = 0;  // tokens whose K/V are in the cache (prompt and output)
  int32_t num_cached_tokens = 0;    // prompt tokens served by the prefix cache at the last (re)start
  int32_t num_prefill_tokens = 0;   // tokens known at the last (re)admission: what prefill computes
  int num_preemptions = 0;

  // Chain Cache: the chain this request continues or starts (empty: none), what it did with it, and the
  // retained turn it resumes from until admission restores it.
  std::string chain_id;
  ChainStatus chain_status = ChainStatus::kNone;
  std::unique_ptr<ChainState> chain_state;
  // A preempted request's cache state, kept on the host tier (MemoryOracle::preempt) until its next admission
  // resumes it.
  std::unique_ptr<ChainState> kept_state;

  Clock::time_point arrival_time;
  std::optional<Clock::time_point> first_token_time;
  Clock::time_point last_token_time;

  Request(std::string id, std::vector<int32_t> prompt, const SamplingParams& p)
      : request_id(std::move(id)),
        token_ids(std::move(prompt)),
        num_prompt_tokens(static_cast<int32_t>(token_ids.size())),
        params(p),
        sampler(p),
        stop_checker(p.stop) {}

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const int32_t> prompt_ids() const { return {token_ids.data(), static_cast<size_t>(num_prompt_tokens)}; }
  std::span<const int32_t> output_ids() const {
    return std::span<const int32_t>(token_ids).subspan(static_cast<size_t>(num_prompt_tokens));
  }
  // Tokens known but not yet in the cache: the rest of the prompt, or the last sampled token.
  int32_t num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }
};

}  // namespace se
