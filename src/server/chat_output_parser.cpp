#include "server/chat_output_parser.h"

namespace se::server {

void ChatDelta::append(ChatDelta more) {
  reasoning += more.reasoning;
  content += more.content;
  for (ToolCallDelta& call : more.calls) calls.push_back(std::move(call));
}

ChatOutputParser::ChatOutputParser(const ChatOutputOptions& options) {
  if (options.reasoning) reasoning_.emplace(*options.reasoning);
  if (options.tool_calls) tools_.emplace(*options.tool_calls, options.tool_call_id_prefix);
}

ChatDelta ChatOutputParser::push(std::string_view text) {
  ChatDelta out;
  ReasoningDelta split = reasoning_ ? reasoning_->push(text) : ReasoningDelta{"", std::string(text)};
  out.reasoning = std::move(split.reasoning);
  if (!tools_) {
    out.content = std::move(split.content);
    return out;
  }
  ToolParseDelta parsed = tools_->push(split.content);
  out.content = std::move(parsed.content);
  out.calls = std::move(parsed.calls);
  return out;
}

ChatDelta ChatOutputParser::flush() {
  ChatDelta out;
  if (reasoning_) {
    ReasoningDelta rest = reasoning_->flush();
    out.reasoning = std::move(rest.reasoning);
    if (!tools_) {
      out.content = std::move(rest.content);
    } else {
      ToolParseDelta parsed = tools_->push(rest.content);
      out.content = std::move(parsed.content);
      out.calls = std::move(parsed.calls);
    }
  }
  if (tools_) {
    ToolParseDelta parsed = tools_->flush();
    out.content += parsed.content;
    for (ToolCallDelta& call : parsed.calls) out.calls.push_back(std::move(call));
  }
  return out;
}

nlohmann::json tool_calls_json(const std::vector<ToolCallDelta>& deltas) {
  nlohmann::json calls = nlohmann::json::array();
  for (const ToolCallDelta& d : deltas) {
    while (static_cast<int>(calls.size()) <= d.index)
      calls.push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
    nlohmann::json& call = calls[static_cast<size_t>(d.index)];
    if (!d.id.empty()) call["id"] = d.id;
    if (!d.name.empty()) call["function"]["name"] = d.name;
    call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() + d.arguments;
  }
  return calls;
}

}  // namespace se::server
