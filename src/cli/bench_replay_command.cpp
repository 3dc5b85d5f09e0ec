// Each session runs on its own thread and connection: turn t sends the whole conversation so far (system prompt,
// task, every assistant reply and tool result) as a streamed chat request with --output-len greedy tokens (EOS
// ignored, so every configuration generates the same amount). With --chain the first turn starts a chain
// (chain_id null) and later turns continue it append-only (chain_id + chain_append_start), as an agent client of
// the Chain Cache does; without it the server's radix cache (if any) finds what it can. A failed turn ends its
// session. TTFT is the time to the first streamed content. With --prune-tool-results-lag K, before each turn the
// tool result that entered the conversation K turns earlier is pruned in the server's radix prefix cache to
// --prune-keep-tokens tokens (tool_result_pruner.h); the time that takes counts in the end-to-end time.
#include "cli/bench_replay_command.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/agent_trace.h"
#include "cli/bench_client.h"
#include "cli/tool_result_pruner.h"

namespace se::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct BenchReplayOptions {
  ServerTarget server;
  AgentTraceOptions trace;
  int output_len = 64;
  bool chain = false;
  ToolResultPruneOptions prune;
  std::string result_json;
};

struct TurnMetrics {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int output_tokens = 0;
  double ttft = 0.0;  // seconds
  std::string reply;
  std::string chain_id;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Reads one SSE event of a streamed chat turn into `m`.
void read_event(const std::string& event, Clock::time_point start, TurnMetrics& m) {
  if (event.rfind("data: ", 0) != 0) return;
  const nlohmann::json chunk = nlohmann::json::parse(event.substr(6), nullptr, false);
  if (chunk.is_discarded() || !chunk.is_object()) return;  // [DONE]
  if (chunk.contains("error")) {
    m.error = chunk["error"].value("message", std::string("error event"));
    return;
  }
  if (chunk.contains("chain_id") && chunk["chain_id"].is_string()) m.chain_id = chunk["chain_id"];
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    m.prompt_tokens = usage->value("prompt_tokens", 0);
    m.output_tokens = usage->value("completion_tokens", 0);
    m.cached_tokens = usage->value("prompt_tokens_details", nlohmann::json::object()).value("cached_tokens", 0);
  }
  const auto& choices = chunk.value("choices", nlohmann::json::array());
  if (choices.empty()) return;
  const std::string content = choices[0].value("delta", nlohmann::json::object()).value("content", std::string());
  if (content.empty()) return;
  if (m.reply.empty()) m.ttft = seconds_since(start);
  m.reply += content;
}

TurnMetrics run_turn(httplib::Client& client, const BenchReplayOptions& o, const std::string& model,
                     const nlohmann::json& messages, const nlohmann::json& chain_fields) {
  TurnMetrics m;
  nlohmann::json body = {{"model", model},       {"messages", messages}, {"max_tokens", o.output_len},
                         {"ignore_eos", true},   {"temperature", 0.0},   {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  body.update(chain_fields);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  std::string buffer;
  const Clock::time_point start = Clock::now();
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    buffer.append(data, size);
    for (size_t end = buffer.find("\n\n"); end != std::string::npos; end = buffer.find("\n\n")) {
      read_event(buffer.substr(0, end), start, m);
      buffer.erase(0, end + 2);
    }
    return true;
  };
  httplib::Result res = client.send(req);
  if (!res) {
    m.error = "connection failed: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    m.error = fmt::format("HTTP {}: {}", res->status, buffer);
  } else if (m.error.empty()) {
    m.ok = m.output_tokens > 0;
    if (!m.ok) m.error = "the stream ended without usage";
  }
  return m;
}

struct SessionResult {
  std::vector<TurnMetrics> turns;
  ToolResultPruneStats prunes;
};

// One session's turns in order; stops at the first failed turn.
SessionResult run_session(const std::string& base_url, const BenchReplayOptions& o, const std::string& model,
                          const AgentSession& session) {
  httplib::Client client(base_url);
  client.set_connection_timeout(30, 0);
  client.set_read_timeout(3600, 0);
  ToolResultPruner pruner(client, o.prune);
  nlohmann::json messages = {{{"role", "system"}, {"content", session.system_prompt}},
                             {{"role", "user"}, {"content", session.task}}};
  std::vector<TurnMetrics> turns;
  std::vector<size_t> tool_result_idx;  // message index of each tool result so far
  std::string chain_id;
  size_t append_start = 0;
  for (int t = 0; t < session.num_turns(); ++t) {
    // Turn t sees tool results 0 .. t-1; the one from `lag` turns ago (t - 1 - lag) is pruned now.
    if (o.prune.lag > 0 && t - 1 - o.prune.lag >= 0)
      pruner.prune(messages, tool_result_idx[static_cast<size_t>(t - 1 - o.prune.lag)]);
    nlohmann::json chain_fields = nlohmann::json::object();
    if (o.chain && t == 0) chain_fields["chain_id"] = nullptr;
    if (o.chain && t > 0) chain_fields = {{"chain_id", chain_id}, {"chain_append_start", append_start}};
    turns.push_back(run_turn(client, o, model, messages, chain_fields));
    const TurnMetrics& m = turns.back();
    if (!m.ok) break;
    if (t == 0) chain_id = m.chain_id;
    messages.push_back({{"role", "assistant"}, {"content", m.reply}});
    if (t + 1 == session.num_turns()) break;
    append_start = messages.size();
    tool_result_idx.push_back(messages.size());
    messages.push_back({{"role", "user"}, {"content", session.tool_results[static_cast<size_t>(t)]}});
  }
  return {std::move(turns), pruner.stats()};
}

int run_bench_replay(const BenchReplayOptions& o) {
  const AgentTraceOptions& t = o.trace;
  if (t.num_sessions < 1 || t.min_turns < 1 || t.max_turns < t.min_turns || t.system_prompt_words < 0 ||
      t.min_tool_result_words < 1 || t.max_tool_result_words < t.min_tool_result_words || o.output_len < 1) {
    std::fprintf(stderr, "error: sessions, turns, lengths must be positive and each max >= its min\n");
    return 2;
  }
  if (o.prune.lag < 0 || o.prune.keep_tokens < 0 || (o.prune.lag > 0 && o.chain)) {
    std::fprintf(stderr, "error: --prune-tool-results-lag and --prune-keep-tokens must be >= 0, and pruning works "
                         "on the radix prefix cache (not with --chain)\n");
    return 2;
  }
  const std::string base_url = o.server.url();
  const Result<std::string> resolved = o.server.resolve_model();
  if (!resolved.is_ok()) return std::fprintf(stderr, "error: %s\n", resolved.status().message().c_str()), 1;
  const std::string& model = *resolved;
  const std::vector<AgentSession> sessions = make_agent_trace(t);
  int num_planned_turns = 0;
  for (const AgentSession& s : sessions) num_planned_turns += s.num_turns();
  std::printf("bench replay: %s at %s, %d sessions, %d turns in all, %d output tokens per turn, chain %s, tool "
              "results pruned after %d turns (0 = never)\n",
              model.c_str(), base_url.c_str(), t.num_sessions, num_planned_turns, o.output_len,
              o.chain ? "on" : "off", o.prune.lag);

  std::vector<SessionResult> results(sessions.size());
  std::vector<std::thread> threads;
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < sessions.size(); ++i)
    threads.emplace_back([&, i] { results[i] = run_session(base_url, o, model, sessions[i]); });
  for (std::thread& thread : threads) thread.join();
  const double duration = seconds_since(start);

  int completed = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  std::vector<double> ttfts;
  std::string first_error;
  ToolResultPruneStats prunes;
  for (const SessionResult& session : results) {
    prunes.completed += session.prunes.completed;
    prunes.blocked += session.prunes.blocked;
    prunes.failed += session.prunes.failed;
    prunes.pages_freed += session.prunes.pages_freed;
    prunes.seconds += session.prunes.seconds;
    if (prunes.first_error.empty()) prunes.first_error = session.prunes.first_error;
    for (const TurnMetrics& m : session.turns) {
      if (!m.ok) {
        if (first_error.empty()) first_error = m.error;
        continue;
      }
      ++completed;
      prompt_tokens += m.prompt_tokens;
      cached_tokens += m.cached_tokens;
      output_tokens += m.output_tokens;
      ttfts.push_back(m.ttft);
    }
  }
  const Summary ttft = summarize_ms(ttfts);
  const nlohmann::json r = {{"model", model},
                            {"base_url", base_url},
                            {"chain", o.chain},
                            {"num_sessions", t.num_sessions},
                            {"planned_turns", num_planned_turns},
                            {"completed_turns", completed},
                            {"duration", duration},
                            {"total_prompt_tokens", prompt_tokens},
                            {"prefill_tokens_avoided", cached_tokens},
                            {"prefill_tokens_computed", prompt_tokens - cached_tokens},
                            {"total_output_tokens", output_tokens},
                            {"output_throughput", static_cast<double>(output_tokens) / duration},
                            {"mean_ttft_ms", ttft.mean},
                            {"median_ttft_ms", ttft.median},
                            {"p99_ttft_ms", ttft.p99},
                            {"prune_tool_results_lag", o.prune.lag},
                            {"prunes_completed", prunes.completed},
                            {"prunes_blocked", prunes.blocked},
                            {"prunes_failed", prunes.failed},
                            {"prune_pages_freed", prunes.pages_freed},
                            {"prune_seconds", prunes.seconds}};
  auto line = [](const char* name, const std::string& value) { std::printf("%-40s %s\n", name, value.c_str()); };
  std::printf("============ Agent Replay Result ============\n");
  line("Completed turns:", fmt::format("{} of {}", completed, num_planned_turns));
  line("End-to-end time (s):", fmt::format("{:.2f}", duration));
  line("Prompt tokens:", fmt::format("{}", prompt_tokens));
  line("Prefill tokens avoided:", fmt::format("{} ({:.1f}%)", cached_tokens,
                                               prompt_tokens > 0 ? 100.0 * cached_tokens / prompt_tokens : 0.0));
  line("Output tokens:", fmt::format("{}", output_tokens));
  line("Output token throughput (tok/s):", fmt::format("{:.2f}", r["output_throughput"].get<double>()));
  line("TTFT mean / median / P99 (ms):", fmt::format("{:.2f} / {:.2f} / {:.2f}", ttft.mean, ttft.median, ttft.p99));
  if (o.prune.lag > 0) {
    line("Prunes completed / blocked / failed:",
         fmt::format("{} / {} / {}", prunes.completed, prunes.blocked, prunes.failed));
    line("Pages freed by pruning:", fmt::format("{}", prunes.pages_freed));
    line("Time in prunes, all sessions (s):", fmt::format("{:.2f}", prunes.seconds));
  }
  std::printf("=============================================\n");
  if (!first_error.empty()) std::fprintf(stderr, "first error: %s\n", first_error.c_str());
  if (!prunes.first_error.empty()) std::fprintf(stderr, "first prune error: %s\n", prunes.first_error.c_str());
  if (!o.result_json.empty()) {
    std::ofstream out(o.result_json);
    out << r.dump(2) << "\n";
    if (!out) return std::fprintf(stderr, "error: cannot write %s\n", o.result_json.c_str()), 1;
  }
  return completed == num_planned_turns ? 0 : 1;
}

}  // namespace

void add_bench_replay_command(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<BenchReplayOptions>();
  CLI::App* cmd = bench.add_subcommand("replay", "replay multi-turn agent sessions against a running server");
  o->server.add_to(*cmd);
  cmd->add_option("--num-sessions", o->trace.num_sessions, "concurrent agent sessions")->capture_default_str();
  cmd->add_option("--min-turns", o->trace.min_turns, "turns per session, at least")->capture_default_str();
  cmd->add_option("--max-turns", o->trace.max_turns, "turns per session, at most")->capture_default_str();
  cmd->add_option("--system-prompt-words", o->trace.system_prompt_words, "length of the shared system prompt")
      ->capture_default_str();
  cmd->add_option("--min-tool-result-words", o->trace.min_tool_result_words, "tool result length, at least")
      ->capture_default_str();
  cmd->add_option("--max-tool-result-words", o->trace.max_tool_result_words, "tool result length, at most")
      ->capture_default_str();
  cmd->add_option("--output-len", o->output_len, "generated tokens per turn (EOS ignored)")->capture_default_str();
  cmd->add_option("--seed", o->trace.seed, "seed of the trace")->capture_default_str();
  cmd->add_flag("--chain", o->chain, "continue each session as a Chain Cache chain (chain_id, chain_append_start)");
  cmd->add_option("--prune-tool-results-lag", o->prune.lag,
                  "prune each tool result in the radix prefix cache this many turns after it appeared (0 = never)")
      ->capture_default_str();
  cmd->add_option("--prune-keep-tokens", o->prune.keep_tokens, "tokens each pruned tool result keeps")
      ->capture_default_str();
  cmd->add_option("--prune-policy", o->prune.policy, "scoring policy of the prunes")
      ->check(CLI::IsMember({"snapkv_global", "kvzip_global"}))
      ->capture_default_str();
  cmd->add_option("--result-json", o->result_json, "write the metrics as JSON to this file");
  cmd->callback([o, &exit_code] { exit_code = run_bench_replay(*o); });
}

}  // namespace se::cli
