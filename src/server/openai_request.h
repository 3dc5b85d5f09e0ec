// Parsing of OpenAI /v1/completions and /v1/chat/completions bodies into one OpenAiRequest, validated as far as
// the body alone allows: field types (a known field of the wrong type is a 400 naming it), fields the server does
// not support (a 400 naming the field, unless its value is null, which OpenAI clients mean as "not given"),
// ranges, the n cap, message roles and content parts, SamplingParams::validate(). What needs the model
// (tokenizing, the chat template, the context-length check) comes after, in the HTTP layer, with
// resolve_max_tokens() for the length rule. Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model_bundle.h"
#include "engine/sampling_params.h"
#include "structured/json_grammar.h"
#include "server/api_error.h"

namespace se::server {

enum class Endpoint { kCompletions, kChatCompletions };

// tool_choice: "none" (tools shown, no call parsed), "auto" (calls parsed when the model writes them),
// "required" (one call of any tool, enforced by constrained decoding), or a named function (one call of it).
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                       // empty when the client sent none (the served model then)
  std::optional<std::string> prompt_text;  // completions: a text prompt
  std::vector<int32_t> prompt_ids;         // completions: a token-id prompt (when prompt_text is empty)
  nlohmann::json messages;                 // chat: [{role, content: string, ...}], content parts joined
  SamplingParams params;                   // params.max_tokens is meaningful only with max_tokens_given
  bool max_tokens_given = false;
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  bool logprobs = false;       // return logprobs; params.logprobs holds the number of alternatives
  // Chain Cache (extra body fields): "chain_id" given (null or "" = start a new chain, else continue that one);
  // chat's "chain_append_start" = the index of the first message after the chain's last assistant reply.
  bool chain = false;
  std::string chain_id;
  std::optional<int> chain_append_start;
  // "timeout" (seconds, extra body field): past it the request is aborted, its pages freed, and the client told.
  std::optional<double> timeout_s;
  // Chat: "tools" (validated: each {"type": "function", "function": {"name", ...}}) and "chat_template_kwargs",
  // for the template; "tool_choice" and, for kNamed, the function's name.
  ChatExtras chat_extras;
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_name;
  // "response_format" json_object / json_schema: the grammar the output must follow; nullopt = free text.
  std::optional<JsonGrammar> response_grammar;
};

struct RequestLimits {
  int max_n = 8;  // choices per request at most (--max-n)
};

// The body as a JSON object. 400 for invalid UTF-8, malformed JSON or a top level that is not an object.
ApiResult<nlohmann::json> parse_json_body(std::string_view body);

// `ordered_body`: the same body parsed with its key order kept, when the caller has it: tool and response
// schemas are then read from it, so that constrained output writes properties in the order the schema gives.
ApiResult<OpenAiRequest> parse_completion_request(const nlohmann::json& body, const RequestLimits& limits,
                                                  const nlohmann::ordered_json* ordered_body = nullptr);
ApiResult<OpenAiRequest> parse_chat_request(const nlohmann::json& body, const RequestLimits& limits,
                                            const nlohmann::ordered_json* ordered_body = nullptr);

// The max_tokens a request runs with, as vLLM decides it: the client's value, else what is left of the context
// (max_model_len - num_prompt_tokens). 400 when the prompt leaves no room or prompt + max_tokens exceeds
// max_model_len, with vLLM's wording.
ApiResult<int> resolve_max_tokens(const OpenAiRequest& request, int num_prompt_tokens, int max_model_len);

}  // namespace se::server
