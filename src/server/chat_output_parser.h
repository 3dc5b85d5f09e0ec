// ChatOutputParser: a chat choice's generated text through the server's reasoning parser, then its tool-call
// parser (either may be off): reasoning, content and tool-call deltas. The same parser serves streamed deltas
// and, fed the whole text at once, the non-streaming message, so both say the same. One per choice; not
// thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace se::server {

struct ChatOutputOptions {
  std::optional<ReasoningFormat> reasoning;  // --reasoning-parser
  std::optional<ToolCallFormat> tool_calls;  // set when the request has tools and tool_choice is not "none"
  std::string tool_call_id_prefix;           // call ids: this prefix and the call's index
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> calls;

  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  void append(ChatDelta more);
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(const ChatOutputOptions& options);

  ChatDelta push(std::string_view text);
  ChatDelta flush();
  int num_calls() const { return tools_ ? tools_->num_calls() : 0; }

 private:
  std::optional<ReasoningParser> reasoning_;
  std::optional<ToolCallParser> tools_;
};

// OpenAI's tool_calls list of a whole message: each call's deltas merged.
nlohmann::json tool_calls_json(const std::vector<ToolCallDelta>& deltas);

}  // namespace se::server
