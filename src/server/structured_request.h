// The agent-facing fields of a request body: chat "tools", "tool_choice" and "chat_template_kwargs", and
// "response_format" (both endpoints), read into an OpenAiRequest. A malformed value, an unsupported schema
// keyword or a tool_choice naming no given tool is a 400 naming the field. Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/tool_call_parser.h"

namespace se::server {

// `ordered_body` (may be null): the body with its key order, which tool and response schemas are taken from.
ApiResult<OpenAiRequest> read_tools(const nlohmann::json& body, const nlohmann::ordered_json* ordered_body,
                                    OpenAiRequest request);
ApiResult<OpenAiRequest> read_response_format(const nlohmann::json& body, const nlohmann::ordered_json* ordered_body,
                                              OpenAiRequest request);

// An assistant message's tool_calls with each function's "arguments" JSON text parsed into an object, as chat
// templates expect them (vLLM does the same). 400 when an arguments text is not a JSON object.
ApiResult<nlohmann::json> with_parsed_tool_arguments(nlohmann::json message, const std::string& field);

// The grammar that makes a request's output one call of its required tool (tool_choice "required": any of its
// tools; named: that one), written as `format` writes calls.
ApiResult<JsonGrammar> required_call_grammar(const OpenAiRequest& request, ToolCallFormat format);

}  // namespace se::server
