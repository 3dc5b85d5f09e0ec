#include "server/openai_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>

#include "server/json_fields.h"
#include "server/structured_request.h"
#include "tokenizer/utf8.h"

namespace se::server {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();

// The body fields each endpoint reads. "user" is OpenAI's end-user tag: it never changes the output.
constexpr std::array<std::string_view, 17> kCommonFields = {
    "model",   "max_tokens",     "temperature",    "top_p", "top_k",  "min_p",          "seed",
    "stop",    "stop_token_ids", "ignore_eos",     "n",     "stream", "stream_options", "chain_id",
    "timeout", "user",           "response_format"};
constexpr std::array<std::string_view, 3> kCompletionFields = {"prompt", "logprobs", "echo"};
constexpr std::array<std::string_view, 8> kChatFields = {"messages",     "max_completion_tokens", "logprobs",
                                                         "top_logprobs", "chain_append_start",    "tools",
                                                         "tool_choice",  "chat_template_kwargs"};

// Whether `value` of field `key` asks for nothing: clients (LangChain, vLLM's benchmarks) send a zero penalty, a
// repetition penalty of 1 or an empty logit_bias by default, and those change no output.
bool is_neutral(std::string_view key, const nlohmann::json& value) {
  if (key == "presence_penalty" || key == "frequency_penalty") return value.is_number() && value.get<double>() == 0.0;
  if (key == "repetition_penalty") return value.is_number() && value.get<double>() == 1.0;
  if (key == "logit_bias") return value.is_object() && value.empty();
  return false;
}

// A 400 naming the first non-null, non-neutral field that neither the shared nor the endpoint's own list holds.
template <size_t N>
std::optional<ApiError> unsupported_field(const nlohmann::json& body,
                                          const std::array<std::string_view, N>& endpoint_fields) {
  for (const auto& [key, value] : body.items()) {
    if (value.is_null() || is_neutral(key, value)) continue;
    const auto known = [&key](const auto& list) { return std::find(list.begin(), list.end(), key) != list.end(); };
    if (!known(kCommonFields) && !known(endpoint_fields))
      return ApiError::bad_request(fmt::format("'{}' is not supported by this server", key), key);
  }
  return std::nullopt;
}

// Fields both endpoints share: model, sampling, n, stream, timeout.
ApiResult<OpenAiRequest> parse_common(const nlohmann::json& body, const RequestLimits& limits,
                                      Endpoint endpoint) {
  const FieldReader fields(body);
  OpenAiRequest request;
  request.endpoint = endpoint;
  SamplingParams& params = request.params;

  SE_API_ASSIGN_OR_RETURN(auto model, fields.get_string("model"));
  request.model = model.value_or("");

  // Chat prefers the newer max_completion_tokens over the deprecated max_tokens, as vLLM does.
  std::optional<int64_t> max_tokens;
  if (endpoint == Endpoint::kChatCompletions) {
    SE_API_ASSIGN_OR_RETURN(max_tokens, fields.get_int("max_completion_tokens", kInt32Min, kInt32Max));
  }
  if (!max_tokens) {
    SE_API_ASSIGN_OR_RETURN(max_tokens, fields.get_int("max_tokens", kInt32Min, kInt32Max));
  }
  request.max_tokens_given = max_tokens.has_value();
  params.max_tokens = static_cast<int>(max_tokens.value_or(1));  // the real default needs the prompt length

  SE_API_ASSIGN_OR_RETURN(auto temperature, fields.get_number("temperature"));
  if (temperature) params.temperature = static_cast<float>(*temperature);
  SE_API_ASSIGN_OR_RETURN(auto top_p, fields.get_number("top_p"));
  if (top_p) params.top_p = static_cast<float>(*top_p);
  SE_API_ASSIGN_OR_RETURN(auto top_k, fields.get_int("top_k", kInt32Min, kInt32Max));
  if (top_k) params.top_k = static_cast<int>(*top_k);
  SE_API_ASSIGN_OR_RETURN(auto min_p, fields.get_number("min_p"));
  if (min_p) params.min_p = static_cast<float>(*min_p);
  SE_API_ASSIGN_OR_RETURN(auto seed, fields.get_int("seed", std::numeric_limits<int64_t>::min(),
                                                    std::numeric_limits<int64_t>::max()));
  if (seed) params.seed = static_cast<uint64_t>(*seed);
  SE_API_ASSIGN_OR_RETURN(params.stop, fields.get_string_or_list("stop"));
  SE_API_ASSIGN_OR_RETURN(auto stop_token_ids, fields.get_int_list("stop_token_ids", 0, kInt32Max));
  for (int64_t id : stop_token_ids) params.stop_token_ids.push_back(static_cast<int32_t>(id));
  SE_API_ASSIGN_OR_RETURN(auto ignore_eos, fields.get_bool("ignore_eos"));
  params.ignore_eos = ignore_eos.value_or(false);

  SE_API_ASSIGN_OR_RETURN(auto n, fields.get_int("n", kInt32Min, kInt32Max));
  request.n = static_cast<int>(n.value_or(1));
  if (request.n < 1 || request.n > limits.max_n)
    return ApiError::bad_request(fmt::format("'n' must be in [1, {}] (the server's --max-n), got {}", limits.max_n,
                                             request.n),
                                 "n");

  SE_API_ASSIGN_OR_RETURN(auto stream, fields.get_bool("stream"));
  request.stream = stream.value_or(false);
  if (const nlohmann::json* options = fields.find("stream_options")) {
    if (!options->is_object()) return fields.type_error("stream_options", "an object", *options);
    SE_API_ASSIGN_OR_RETURN(auto include_usage, FieldReader(*options, "stream_options").get_bool("include_usage"));
    request.include_usage = include_usage.value_or(false);
  }
  SE_API_ASSIGN_OR_RETURN(request.timeout_s, fields.get_number("timeout"));
  if (request.timeout_s && !(*request.timeout_s > 0))
    return ApiError::bad_request(fmt::format("'timeout' must be a positive number of seconds, got {}",
                                             *request.timeout_s),
                                 "timeout");
  return request;
}

// Checks the finished SamplingParams; the message names the field.
// chain_id: a string or null (a new chain); chain_append_start (chat): an integer that continues a named chain.
ApiResult<OpenAiRequest> read_chain_fields(const nlohmann::json& body, OpenAiRequest request) {
  const FieldReader fields(body);
  if (body.contains("chain_id")) {
    const nlohmann::json& id = body["chain_id"];
    if (!id.is_null() && !id.is_string()) return fields.type_error("chain_id", "a string or null", id);
    request.chain = true;
    if (id.is_string()) request.chain_id = id.get<std::string>();
    if (request.n != 1) return ApiError::bad_request("a chain request must have n = 1", "n");
  }
  SE_API_ASSIGN_OR_RETURN(auto append_start, fields.get_int("chain_append_start", 1, kInt32Max));
  if (!append_start) return request;
  if (request.endpoint != Endpoint::kChatCompletions)
    return ApiError::bad_request("'chain_append_start' is a chat field", "chain_append_start");
  if (request.chain_id.empty())
    return ApiError::bad_request("'chain_append_start' continues a chain: give its 'chain_id'", "chain_append_start");
  request.chain_append_start = static_cast<int>(*append_start);
  return request;
}

ApiResult<OpenAiRequest> validated(OpenAiRequest request) {
  const Status status = request.params.validate();
  if (!status.is_ok()) return ApiError::from_status(status);
  return request;
}

// prompt: a string, a list of one string, a list of token ids, or a list of one list of token ids.
ApiResult<OpenAiRequest> read_prompt(const nlohmann::json& body, OpenAiRequest request) {
  const FieldReader fields(body);
  const nlohmann::json* prompt = fields.find("prompt");
  constexpr std::string_view kExpected = "a string, a list of one string, or a list of token ids";
  if (!prompt) return ApiError::bad_request("'prompt' is required", "prompt");
  if (prompt->is_string()) {
    request.prompt_text = prompt->get<std::string>();
    return request;
  }
  if (!prompt->is_array() || prompt->empty()) return fields.type_error("prompt", kExpected, *prompt);
  const nlohmann::json& first = prompt->front();
  if (first.is_string() || first.is_array()) {
    if (prompt->size() > 1)
      return ApiError::bad_request("batched prompts are not supported: send one prompt per request", "prompt");
    if (first.is_string()) {
      request.prompt_text = first.get<std::string>();
      return request;
    }
  }
  const nlohmann::json& ids = first.is_array() ? first : *prompt;
  for (const nlohmann::json& id : ids) {
    if (!id.is_number_integer()) return fields.type_error("prompt", kExpected, *prompt);
    // Parsed JSON holds non-negative numbers as unsigned; clamp those past int32 to one past the limit.
    const int64_t v = id.is_number_unsigned()
                          ? static_cast<int64_t>(std::min<uint64_t>(id.get<uint64_t>(), uint64_t{1} << 31))
                          : id.get<int64_t>();
    if (v < 0 || v > kInt32Max)
      return ApiError::bad_request(fmt::format("'prompt' token ids must be non-negative 32-bit integers, got {}",
                                               id.dump()),
                                   "prompt");
    request.prompt_ids.push_back(static_cast<int32_t>(v));
  }
  if (request.prompt_ids.empty()) return ApiError::bad_request("'prompt' must not be empty", "prompt");
  return request;
}

// Message content: a string, or a list of text parts ({"type": "text", "text": ...} or bare strings), joined
// with newlines as vLLM does. Null is allowed for assistant messages (tool calls).
ApiResult<std::string> read_content(const nlohmann::json& message, const std::string& field, bool allow_null) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    if (allow_null) return std::string();
    return ApiError::bad_request(fmt::format("'{}' is required", field), field);
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    return ApiError::bad_request(
        fmt::format("'{}' must be a string or a list of content parts, got {}", field, json_type_name(*it)), field);
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& part = (*it)[i];
    const std::string part_field = fmt::format("{}[{}]", field, i);
    std::string piece;
    if (part.is_string()) {
      piece = part.get<std::string>();
    } else if (part.is_object()) {
      auto type = part.find("type");
      if (type == part.end() || !type->is_string())
        return ApiError::bad_request(fmt::format("'{}.type' must be a string", part_field), part_field);
      if (*type != "text")
        return ApiError::bad_request(fmt::format("'{}': content parts of type {} are not supported (only text)",
                                                 part_field, type->dump()),
                                     part_field);
      auto part_text = part.find("text");
      if (part_text == part.end() || !part_text->is_string())
        return ApiError::bad_request(fmt::format("'{}.text' must be a string", part_field), part_field);
      piece = part_text->get<std::string>();
    } else {
      return ApiError::bad_request(
          fmt::format("'{}' must be a text part or a string, got {}", part_field, json_type_name(part)), part_field);
    }
    if (i > 0) text += '\n';
    text += piece;
  }
  return text;
}

ApiResult<nlohmann::json> read_messages(const nlohmann::json& body) {
  const FieldReader fields(body);
  const nlohmann::json* messages = fields.find("messages");
  if (!messages) return ApiError::bad_request("'messages' is required", "messages");
  if (!messages->is_array()) return fields.type_error("messages", "a list of messages", *messages);
  if (messages->empty()) return ApiError::bad_request("'messages' must not be empty", "messages");
  static constexpr std::array<std::string_view, 4> kRoles = {"system", "user", "assistant", "tool"};
  nlohmann::json normalized = nlohmann::json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const nlohmann::json& message = (*messages)[i];
    const std::string field = fmt::format("messages[{}]", i);
    if (!message.is_object())
      return ApiError::bad_request(fmt::format("'{}' must be an object, got {}", field, json_type_name(message)),
                                   field);
    auto role_it = message.find("role");
    if (role_it == message.end() || !role_it->is_string())
      return ApiError::bad_request(fmt::format("'{}.role' must be a string", field), field + ".role");
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (std::find(kRoles.begin(), kRoles.end(), role) == kRoles.end())
      return ApiError::bad_request(fmt::format("'{}.role': unsupported role {}; expected system, user, assistant "
                                               "or tool",
                                               field, role_it->dump()),
                                   field + ".role");
    SE_API_ASSIGN_OR_RETURN(std::string content, read_content(message, field + ".content", role == "assistant"));
    nlohmann::json out = message;  // keeps name, tool_calls, tool_call_id for the template
    out["role"] = role;
    out["content"] = std::move(content);
    SE_API_ASSIGN_OR_RETURN(out, with_parsed_tool_arguments(std::move(out), field));
    normalized.push_back(std::move(out));
  }
  return normalized;
}

}  // namespace

ApiResult<nlohmann::json> parse_json_body(std::string_view body) {
  if (!utf8::is_valid(body)) return ApiError::bad_request("the request body is not valid UTF-8");
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return ApiError::bad_request("the request body is not valid JSON");
  if (!parsed.is_object())
    return ApiError::bad_request(fmt::format("the request body must be a JSON object, got {}",
                                             json_type_name(parsed)));
  return parsed;
}

ApiResult<OpenAiRequest> parse_completion_request(const nlohmann::json& body, const RequestLimits& limits,
                                                  const nlohmann::ordered_json* ordered_body) {
  if (std::optional<ApiError> error = unsupported_field(body, kCompletionFields)) return *error;
  SE_API_ASSIGN_OR_RETURN(OpenAiRequest request, parse_common(body, limits, Endpoint::kCompletions));
  SE_API_ASSIGN_OR_RETURN(request, read_prompt(body, std::move(request)));
  const FieldReader fields(body);
  SE_API_ASSIGN_OR_RETURN(auto logprobs, fields.get_int("logprobs", 0, SamplingParams::kMaxLogprobs));
  request.logprobs = logprobs.has_value();
  request.params.logprobs = logprobs ? static_cast<int>(*logprobs) : -1;
  SE_API_ASSIGN_OR_RETURN(auto echo, fields.get_bool("echo"));
  if (echo.value_or(false)) return ApiError::bad_request("'echo' is not supported", "echo");
  SE_API_ASSIGN_OR_RETURN(request, read_chain_fields(body, std::move(request)));
  SE_API_ASSIGN_OR_RETURN(request, read_response_format(body, ordered_body, std::move(request)));
  return validated(std::move(request));
}

ApiResult<OpenAiRequest> parse_chat_request(const nlohmann::json& body, const RequestLimits& limits,
                                            const nlohmann::ordered_json* ordered_body) {
  if (std::optional<ApiError> error = unsupported_field(body, kChatFields)) return *error;
  SE_API_ASSIGN_OR_RETURN(OpenAiRequest request, parse_common(body, limits, Endpoint::kChatCompletions));
  SE_API_ASSIGN_OR_RETURN(request.messages, read_messages(body));
  const FieldReader fields(body);
  SE_API_ASSIGN_OR_RETURN(auto logprobs, fields.get_bool("logprobs"));
  SE_API_ASSIGN_OR_RETURN(auto top_logprobs, fields.get_int("top_logprobs", 0, SamplingParams::kMaxLogprobs));
  request.logprobs = logprobs.value_or(false);
  if (top_logprobs && *top_logprobs > 0 && !request.logprobs)
    return ApiError::bad_request("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
  request.params.logprobs = request.logprobs ? static_cast<int>(top_logprobs.value_or(0)) : -1;
  SE_API_ASSIGN_OR_RETURN(request, read_chain_fields(body, std::move(request)));
  if (request.chain_append_start && *request.chain_append_start >= static_cast<int>(request.messages.size()))
    return ApiError::bad_request("'chain_append_start' must point at a message after the chain's last reply",
                                 "chain_append_start");
  SE_API_ASSIGN_OR_RETURN(request, read_tools(body, ordered_body, std::move(request)));
  SE_API_ASSIGN_OR_RETURN(request, read_response_format(body, ordered_body, std::move(request)));
  return validated(std::move(request));
}

ApiResult<int> resolve_max_tokens(const OpenAiRequest& request, int num_prompt_tokens, int max_model_len) {
  const char* input = request.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (num_prompt_tokens >= max_model_len)
    return ApiError::bad_request(fmt::format("This model's maximum context length is {} tokens. However, your "
                                             "request has {} input tokens. Please reduce the length of the {}.",
                                             max_model_len, num_prompt_tokens, input),
                                 input);
  if (!request.max_tokens_given) return max_model_len - num_prompt_tokens;
  const int64_t total = int64_t{num_prompt_tokens} + request.params.max_tokens;
  if (total > max_model_len)
    return ApiError::bad_request(fmt::format("This model's maximum context length is {} tokens. However, you "
                                             "requested {} tokens ({} in the {}, {} in the completion). Please "
                                             "reduce the length of the {} or completion.",
                                             max_model_len, total, num_prompt_tokens, input,
                                             request.params.max_tokens, input),
                                 "max_tokens");
  return request.params.max_tokens;
}

}  // namespace se::server
