// ToolResultPruner: `bench replay`'s tool-result pruning. Before a turn it prunes, through the server's
// POST /v1/prefix_cache/prune, the tool result that entered the conversation `lag` turns earlier: the tool
// result's token range comes from POST /tokenize (the conversation up to that message and up to the one before,
// each the longest common prefix with the full prompt), the token sequence is the turn's whole prompt (so
// snapkv_global's window is the newest context), and it waits for the prune to finish. One per session thread;
// not thread-safe.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace se::cli {

struct ToolResultPruneOptions {
  int lag = 0;              // turns a tool result stays whole; 0 = never prune
  int keep_tokens = 64;     // per tool result (at most its size)
  std::string policy = "snapkv_global";
};

// Counts of one session's prunes.
struct ToolResultPruneStats {
  int completed = 0, blocked = 0, failed = 0;
  int64_t pages_freed = 0;
  double seconds = 0;  // spent tokenizing, pruning and waiting
  std::string first_error;
};

class ToolResultPruner {
 public:
  ToolResultPruner(httplib::Client& client, const ToolResultPruneOptions& options)
      : client_(client), options_(options) {}

  // Before the turn whose prompt is `messages`: prunes message `message_idx` (a tool result).
  void prune(const nlohmann::json& messages, size_t message_idx);
  const ToolResultPruneStats& stats() const { return stats_; }

 private:
  // POST `path` with `body`; the JSON answer, or null (the error recorded).
  nlohmann::json post(const std::string& path, const nlohmann::json& body);
  std::vector<int32_t> tokenize(const nlohmann::json& messages, bool add_generation_prompt);
  // Polls the prune's status until it leaves "queued", and counts the outcome.
  void wait_for(const std::string& prune_id);
  void record_error(const std::string& error);

  httplib::Client& client_;
  ToolResultPruneOptions options_;
  ToolResultPruneStats stats_;
};

}  // namespace se::cli
