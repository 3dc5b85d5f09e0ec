// AgentTrace: synthetic multi-turn agent sessions for `bench replay`, shaped like coding-agent traffic: a long
// system prompt, a task, then turns in which the assistant emits a tool call and the conversation grows by a
// tool result of hundreds to thousands of tokens. Text is built from code-search-like lines so it tokenizes like
// real tool output; lengths are in words (about 1.3 tokens each for BPE vocabularies). Deterministic per seed.
// Pure data; thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace se::cli {

struct AgentTraceOptions {
  int num_sessions = 8;
  int min_turns = 10;
  int max_turns = 40;
  int system_prompt_words = 1500;
  int min_tool_result_words = 400;   // about 500 tokens
  int max_tool_result_words = 6000;  // about 8,000 tokens
  uint64_t seed = 0;
};

struct AgentSession {
  std::string system_prompt;
  std::string task;
  // [turn - 1]: the tool result that follows the assistant's reply of that turn (the last turn has none).
  std::vector<std::string> tool_results;

  int num_turns() const { return static_cast<int>(tool_results.size()) + 1; }
};

std::vector<AgentSession> make_agent_trace(const AgentTraceOptions& options);

}  // namespace se::cli
