#include "server/structured_request.h"

#include <fmt/format.h>

#include "server/json_fields.h"

namespace se::server {

namespace {

// `value` (a field of `body`) as `ordered_body` spells it, or with sorted keys when there is no ordered body.
nlohmann::ordered_json ordered(const nlohmann::json& value, const nlohmann::ordered_json* ordered_body,
                               const nlohmann::ordered_json::json_pointer& at) {
  if (ordered_body != nullptr && ordered_body->contains(at)) return (*ordered_body)[at];
  return nlohmann::ordered_json::parse(value.dump());
}

ApiError schema_error(const Status& status, const std::string& param) {
  return ApiError::bad_request(fmt::format("'{}': {}", param, status.message()), param);
}

// Each tool: {"type": "function", "function": {"name": non-empty string, "description"?: string,
// "parameters"?: object, "strict"?: bool}}.
ApiResult<nlohmann::json> read_tool_list(const nlohmann::json& tools) {
  if (!tools.is_array() || tools.empty())
    return ApiError::bad_request("'tools' must be a non-empty list of tools", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string field = fmt::format("tools[{}]", i);
    const nlohmann::json& tool = tools[i];
    if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
        !tool["function"].is_object())
      return ApiError::bad_request(fmt::format("'{}' must be {{\"type\": \"function\", \"function\": {{...}}}}", field),
                                   field);
    const nlohmann::json& function = tool["function"];
    if (!function.contains("name") || !function["name"].is_string() || function["name"].get<std::string>().empty())
      return ApiError::bad_request(fmt::format("'{}.function.name' must be a non-empty string", field), field);
    if (function.contains("parameters") && !function["parameters"].is_object())
      return ApiError::bad_request(fmt::format("'{}.function.parameters' must be a JSON schema object", field), field);
    for (size_t j = 0; j < i; ++j)
      if (tools[j]["function"]["name"] == function["name"])
        return ApiError::bad_request(fmt::format("'{}': two tools are named {}", field, function["name"].dump()),
                                     field);
  }
  return tools;
}

}  // namespace

ApiResult<OpenAiRequest> read_tools(const nlohmann::json& body, const nlohmann::ordered_json* ordered_body,
                                    OpenAiRequest request) {
  const FieldReader fields(body);
  if (const nlohmann::json* kwargs = fields.find("chat_template_kwargs")) {
    if (!kwargs->is_object()) return fields.type_error("chat_template_kwargs", "an object", *kwargs);
    request.chat_extras.template_kwargs =
        ordered(*kwargs, ordered_body, nlohmann::ordered_json::json_pointer("/chat_template_kwargs"));
  }
  const nlohmann::json* tools = fields.find("tools");
  const nlohmann::json* choice = fields.find("tool_choice");
  if (tools) {
    SE_API_ASSIGN_OR_RETURN(nlohmann::json list, read_tool_list(*tools));
    request.chat_extras.tools = ordered(list, ordered_body, nlohmann::ordered_json::json_pointer("/tools"));
    request.tool_choice = ToolChoice::kAuto;
  }
  if (!choice) return request;
  if (choice->is_string()) {
    const std::string value = choice->get<std::string>();
    if (value == "none")
      request.tool_choice = ToolChoice::kNone;
    else if (value == "auto")
      request.tool_choice = ToolChoice::kAuto;
    else if (value == "required")
      request.tool_choice = ToolChoice::kRequired;
    else
      return ApiError::bad_request(fmt::format("'tool_choice' must be none, auto, required or a named function, "
                                               "got {}",
                                               choice->dump()),
                                   "tool_choice");
  } else if (choice->is_object() && choice->value("type", "") == "function" && choice->contains("function") &&
             (*choice)["function"].is_object() && (*choice)["function"].contains("name") &&
             (*choice)["function"]["name"].is_string()) {
    request.tool_choice = ToolChoice::kNamed;
    request.tool_name = (*choice)["function"]["name"].get<std::string>();
  } else {
    return fields.type_error("tool_choice",
                             "none, auto, required or {\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}",
                             *choice);
  }
  if (request.tool_choice != ToolChoice::kNone && !tools)
    return ApiError::bad_request("'tool_choice' needs 'tools'", "tool_choice");
  if (request.tool_choice == ToolChoice::kNamed) {
    bool found = false;
    for (const auto& tool : *tools) found = found || tool["function"]["name"] == request.tool_name;
    if (!found)
      return ApiError::bad_request(
          fmt::format("'tool_choice' names '{}', which is not among the tools", request.tool_name), "tool_choice");
  }
  return request;
}

ApiResult<OpenAiRequest> read_response_format(const nlohmann::json& body, const nlohmann::ordered_json* ordered_body,
                                              OpenAiRequest request) {
  const FieldReader fields(body);
  const nlohmann::json* format = fields.find("response_format");
  if (!format) return request;
  if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string())
    return fields.type_error("response_format", "an object with a 'type'", *format);
  const std::string type = (*format)["type"].get<std::string>();
  if (type == "text") return request;
  if (type == "json_object") {
    request.response_grammar = JsonGrammar::any_object();
  } else if (type == "json_schema") {
    const auto spec = format->find("json_schema");
    if (spec == format->end() || !spec->is_object() || !spec->contains("schema"))
      return ApiError::bad_request("'response_format.json_schema' must be an object with a 'schema'",
                                   "response_format");
    Result<JsonGrammar> grammar = JsonGrammar::from_schema(ordered(
        (*spec)["schema"], ordered_body, nlohmann::ordered_json::json_pointer("/response_format/json_schema/schema")));
    if (!grammar.is_ok()) return schema_error(grammar.status(), "response_format");
    request.response_grammar = std::move(grammar).value();
  } else {
    return ApiError::bad_request(fmt::format("'response_format.type' must be text, json_object or json_schema, got "
                                             "'{}'",
                                             type),
                                 "response_format");
  }
  if (request.tool_choice == ToolChoice::kRequired || request.tool_choice == ToolChoice::kNamed)
    return ApiError::bad_request(
        "'response_format' cannot constrain the output of a request whose 'tool_choice' "
        "requires a tool call",
        "response_format");
  return request;
}

ApiResult<nlohmann::json> with_parsed_tool_arguments(nlohmann::json message, const std::string& field) {
  auto calls = message.find("tool_calls");
  if (calls == message.end() || calls->is_null()) return message;
  if (!calls->is_array()) return ApiError::bad_request(fmt::format("'{}.tool_calls' must be a list", field), field);
  for (size_t i = 0; i < calls->size(); ++i) {
    nlohmann::json& call = (*calls)[i];
    const std::string call_field = fmt::format("{}.tool_calls[{}]", field, i);
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].contains("name") || !call["function"]["name"].is_string())
      return ApiError::bad_request(fmt::format("'{}' must have a function with a name", call_field), call_field);
    nlohmann::json& args = call["function"]["arguments"];
    if (!args.is_string()) continue;
    nlohmann::json parsed = nlohmann::json::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object())
      return ApiError::bad_request(fmt::format("'{}.function.arguments' must be a JSON object's text", call_field),
                                   call_field);
    args = std::move(parsed);
  }
  return message;
}

ApiResult<JsonGrammar> required_call_grammar(const OpenAiRequest& request, ToolCallFormat format) {
  std::vector<JsonGrammar::Alternative> calls;
  for (const auto& tool : request.chat_extras.tools) {
    const std::string name = tool["function"]["name"].get<std::string>();
    if (request.tool_choice == ToolChoice::kNamed && name != request.tool_name) continue;
    const ToolCallSyntax syntax = tool_call_syntax(format, name);
    // A tool without parameters takes any object.
    const nlohmann::ordered_json& function = tool["function"];
    nlohmann::ordered_json schema =
        function.contains("parameters") ? function["parameters"] : nlohmann::ordered_json{{"type", "object"}};
    calls.push_back({syntax.prefix, std::move(schema), syntax.suffix});
  }
  Result<JsonGrammar> grammar = JsonGrammar::choice(calls);
  if (!grammar.is_ok()) return schema_error(grammar.status(), "tools");
  return std::move(grammar).value();
}

}  // namespace se::server
