#include "cli/agent_trace.h"

#include <fmt/format.h>

#include <array>
#include <random>

namespace se::cli {

namespace {

constexpr std::array<const char*, 16> kWords = {
    "config", "parse", "request", "handler", "cache", "session", "token", "buffer",
    "error", "stream", "retry", "index", "schema", "worker", "queue", "result"};

// About `num_words` words of grep/ls-like tool output.
std::string tool_output(std::mt19937_64& rng, int num_words) {
  std::string text;
  int words = 0;
  while (words < num_words) {
    const char* a = kWords[rng() % kWords.size()];
    const char* b = kWords[rng() % kWords.size()];
    text += fmt::format("src/{}/{}_{}.py:{}: def {}_{}(self, {}):\n", a, b, rng() % 50, rng() % 900 + 1, b, a,
                        kWords[rng() % kWords.size()]);
    words += 8;
  }
  return text;
}

}  // namespace

std::vector<AgentSession> make_agent_trace(const AgentTraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  // One system prompt for every session: agents of one deployment share it.
  std::string system_prompt =
      "You are a software engineering agent. Work in small steps: call one tool per turn with a line "
      "`CALL tool(arguments)`, read its result, and finish with a short answer. Tools and repository map:\n";
  system_prompt += tool_output(rng, o.system_prompt_words);
  std::uniform_int_distribution<int> turns(o.min_turns, std::max(o.min_turns, o.max_turns));
  std::uniform_int_distribution<int> result_words(o.min_tool_result_words,
                                                  std::max(o.min_tool_result_words, o.max_tool_result_words));
  std::vector<AgentSession> sessions(static_cast<size_t>(o.num_sessions));
  for (size_t i = 0; i < sessions.size(); ++i) {
    AgentSession& s = sessions[i];
    s.system_prompt = system_prompt;
    s.task = fmt::format("Task {}: find why the {} {} fails under load and propose a fix.", i,
                         kWords[rng() % kWords.size()], kWords[rng() % kWords.size()]);
    const int num_turns = turns(rng);
    for (int t = 1; t < num_turns; ++t)
      s.tool_results.push_back(fmt::format("Tool result {}:\n{}", t, tool_output(rng, result_words(rng))));
  }
  return sessions;
}

}  // namespace se::cli
