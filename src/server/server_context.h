// ServerConfig (the HTTP knobs) and ServerContext: what every route handler shares: the engine, the limits, the
// drain flag, the count of generation requests in flight, and the vocabulary trie constrained decoding walks. The
// context outlives the HTTP threads; its mutable parts are atomics or guarded by their own mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "engine/engine.h"
#include "server/openai_request.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"
#include "structured/vocab_trie.h"

namespace se::server {

struct ServerConfig {
  std::string host = "0.0.0.0";
  int port = 8000;                          // 0 = any free port (HttpServer::port() tells which)
  int max_n = 8;                            // choices per request at most
  int num_threads = 64;                     // HTTP workers; each streaming client holds one while it streams
  size_t max_body_bytes = size_t{32} << 20; // larger bodies answer 413
  std::string api_key;                      // non-empty: every route but /health needs "Bearer <api_key>"
  int max_waiting_requests = 0;             // > 0: a generation request answers 503 while this many wait
  std::optional<ReasoningFormat> reasoning_format;  // --reasoning-parser: chat replies get reasoning_content
  std::optional<ToolCallFormat> tool_call_format;   // --tool-call-parser: chat requests may use tools
};

// Counts generation requests from submission until their response is written or abandoned.
class InflightCounter {
 public:
  void add() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
  }
  void remove() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --count_;
    }
    idle_.notify_all();
  }
  int count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }
  // True when the count reached zero within `timeout`.
  bool wait_idle(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return idle_.wait_for(lock, timeout, [&] { return count_ == 0; });
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable idle_;
  int count_ = 0;
};

struct ServerContext {
  ServerContext(Engine& engine, ServerConfig config, int max_model_len, int64_t created)
      : engine(engine),
        config(std::move(config)),
        limits{this->config.max_n},
        max_model_len(max_model_len),
        created(created) {
    if (engine.bundle().tokenizer)
      vocab = std::make_shared<const VocabTrie>(VocabTrie::from_tokenizer(*engine.bundle().tokenizer));
  }

  Engine& engine;
  ServerConfig config;
  RequestLimits limits;
  int max_model_len = 0;  // resolved (never 0)
  int64_t created = 0;    // Unix seconds when serving started (/v1/models)
  std::atomic<bool> draining{false};
  InflightCounter inflight;
  std::shared_ptr<const VocabTrie> vocab;  // for constrained decoding; null without a tokenizer
};

}  // namespace se::server
