#include "cli/tool_result_pruner.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

namespace se::cli {

namespace {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
}

}  // namespace

void ToolResultPruner::record_error(const std::string& error) {
  ++stats_.failed;
  if (stats_.first_error.empty()) stats_.first_error = error;
}

nlohmann::json ToolResultPruner::post(const std::string& path, const nlohmann::json& body) {
  httplib::Result res = client_.Post(path, body.dump(), "application/json");
  if (!res) {
    record_error(path + ": connection failed: " + httplib::to_string(res.error()));
    return nullptr;
  }
  if (res->status / 100 != 2) {
    record_error(fmt::format("{}: HTTP {}: {}", path, res->status, res->body));
    return nullptr;
  }
  nlohmann::json answer = nlohmann::json::parse(res->body, nullptr, false);
  if (answer.is_discarded()) {
    record_error(path + ": the answer is not JSON");
    return nullptr;
  }
  return answer;
}

std::vector<int32_t> ToolResultPruner::tokenize(const nlohmann::json& messages, bool add_generation_prompt) {
  const nlohmann::json answer =
      post("/tokenize", {{"messages", messages}, {"add_generation_prompt", add_generation_prompt}});
  return answer.is_object() ? answer.value("tokens", std::vector<int32_t>()) : std::vector<int32_t>();
}

void ToolResultPruner::prune(const nlohmann::json& messages, size_t message_idx) {
  const auto start_time = std::chrono::steady_clock::now();
  const auto first = [&](size_t n) {
    return nlohmann::json(messages.begin(), messages.begin() + static_cast<ptrdiff_t>(n));
  };
  const std::vector<int32_t> prompt = tokenize(messages, true);
  const size_t start = common_prefix(prompt, tokenize(first(message_idx), false));
  const size_t end = common_prefix(prompt, tokenize(first(message_idx + 1), false));
  if (!prompt.empty() && end > start) {
    const size_t keep = std::min(static_cast<size_t>(options_.keep_tokens), end - start);
    const nlohmann::json queued = post("/v1/prefix_cache/prune", {{"token_ids", prompt},
                                                                  {"range_start", start},
                                                                  {"range_end", end},
                                                                  {"keep_tokens", keep},
                                                                  {"policy", options_.policy}});
    if (queued.is_object()) wait_for(queued.value("prune_id", ""));
  }
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();
}

void ToolResultPruner::wait_for(const std::string& prune_id) {
  const std::string path = "/v1/prefix_cache/prune/" + prune_id;
  while (true) {
    httplib::Result res = client_.Get(path);
    if (!res || res->status != 200) return record_error(path + ": no status");
    const nlohmann::json status = nlohmann::json::parse(res->body, nullptr, false);
    const std::string state = status.is_object() ? status.value("status", "") : "";
    if (state == "queued") {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (state == "completed") {
      ++stats_.completed;
      stats_.pages_freed += status.value("pages_freed", 0);
    } else if (state == "blocked") {
      ++stats_.blocked;
    } else {
      record_error(path + ": " + res->body);
    }
    return;
  }
}

}  // namespace se::cli
