#include "server/openai_response.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace se::server {

namespace {

// JSON has no -inf: clamp as vLLM does.
double wire_logprob(float logprob) { return std::max(static_cast<double>(logprob), -9999.0); }

// Characters (code points) in valid UTF-8 text, as Python's len() counts text_offset.
size_t num_chars(std::string_view text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

nlohmann::json byte_list(std::string_view bytes) {
  nlohmann::json out = nlohmann::json::array();
  for (char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

nlohmann::json stop_reason_json(const ChoiceState& state) {
  return state.stop_reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(state.stop_reason);
}

nlohmann::json finish_json(FinishReason reason) {
  return reason == FinishReason::kNone ? nlohmann::json(nullptr) : nlohmann::json(openai_finish_reason(reason));
}

}  // namespace

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& value) { return "data: " + dump_json(value) + "\n\n"; }

std::string_view openai_finish_reason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: return "";
  }
  return "";
}

nlohmann::json Usage::to_json() const {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

void ChoiceState::absorb(const RequestOutput& delta, bool keep_tokens) {
  text += delta.text;
  if (keep_tokens) tokens.insert(tokens.end(), delta.tokens.begin(), delta.tokens.end());
  if (delta.finished) {
    finish_reason = delta.finish_reason;
    stop_reason = delta.stop_reason;
    chain_status = delta.chain_status;
  }
  num_prompt_tokens = std::max(num_prompt_tokens, delta.num_prompt_tokens);
  num_cached_tokens = std::max(num_cached_tokens, delta.num_cached_tokens);
  num_output_tokens = std::max(num_output_tokens, delta.num_output_tokens);
}

Usage usage_of(std::span<const ChoiceState> choices) {
  Usage usage;
  for (const ChoiceState& c : choices) {
    usage.prompt_tokens = std::max(usage.prompt_tokens, c.num_prompt_tokens);
    usage.cached_tokens = std::max(usage.cached_tokens, c.num_cached_tokens);
    usage.completion_tokens += c.num_output_tokens;
  }
  return usage;
}

ResponseFormatter::ResponseFormatter(Endpoint endpoint, std::string id, std::string model, int64_t created,
                                     bool logprobs, bool include_usage, TokenBytesFn token_bytes)
    : endpoint_(endpoint),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      logprobs_(logprobs),
      include_usage_(include_usage),
      token_bytes_(std::move(token_bytes)) {}

nlohmann::json ResponseFormatter::chat_logprob_entry(int32_t token_id, float logprob) const {
  const std::string bytes = token_bytes_(token_id);
  return {{"token", utf8::sanitize(bytes)}, {"logprob", wire_logprob(logprob)}, {"bytes", byte_list(bytes)}};
}

nlohmann::json ResponseFormatter::logprobs_json(std::span<const TokenOutput> tokens, size_t& text_offset) const {
  if (endpoint_ == Endpoint::kChatCompletions) {
    nlohmann::json content = nlohmann::json::array();
    for (const TokenOutput& t : tokens) {
      nlohmann::json entry = chat_logprob_entry(t.token_id, t.logprob);
      nlohmann::json top = nlohmann::json::array();
      for (const TokenLogprob& alt : t.top) top.push_back(chat_logprob_entry(alt.token_id, alt.logprob));
      entry["top_logprobs"] = std::move(top);
      content.push_back(std::move(entry));
    }
    return {{"content", std::move(content)}};
  }
  nlohmann::json text_offsets = nlohmann::json::array(), token_logprobs = nlohmann::json::array(),
                 token_texts = nlohmann::json::array(), top_logprobs = nlohmann::json::array();
  for (const TokenOutput& t : tokens) {
    const std::string text = utf8::sanitize(token_bytes_(t.token_id));
    // The legacy format maps text -> logprob over the alternatives plus the sampled token.
    nlohmann::json top = nlohmann::json::object();
    for (const TokenLogprob& alt : t.top) top[utf8::sanitize(token_bytes_(alt.token_id))] = wire_logprob(alt.logprob);
    top[text] = wire_logprob(t.logprob);
    text_offsets.push_back(text_offset);
    token_logprobs.push_back(wire_logprob(t.logprob));
    top_logprobs.push_back(std::move(top));
    text_offset += num_chars(text);
    token_texts.push_back(text);
  }
  return {{"text_offset", std::move(text_offsets)},
          {"token_logprobs", std::move(token_logprobs)},
          {"tokens", std::move(token_texts)},
          {"top_logprobs", std::move(top_logprobs)}};
}

nlohmann::json ResponseFormatter::with_chain_status(nlohmann::json chunk, const ChoiceState& state) const {
  if (!chain_id_.empty() && state.finished()) chunk["chain_status"] = chain_status_name(state.chain_status);
  return chunk;
}

nlohmann::json ResponseFormatter::chunk(nlohmann::json choice) const {
  nlohmann::json out = {
      {"id", id_},
      {"object", endpoint_ == Endpoint::kChatCompletions ? "chat.completion.chunk" : "text_completion"},
      {"created", created_},
      {"model", model_},
      {"choices", nlohmann::json::array({std::move(choice)})}};
  if (include_usage_) out["usage"] = nullptr;  // as OpenAI: every chunk but the last has usage null
  if (!chain_id_.empty()) out["chain_id"] = chain_id_;
  return out;
}

std::string ResponseFormatter::stream_start(int num_choices) const {
  if (endpoint_ != Endpoint::kChatCompletions) return "";
  std::string events;
  for (int i = 0; i < num_choices; ++i)
    events += sse_event(chunk({{"index", i},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}));
  return events;
}

nlohmann::json ResponseFormatter::chat_delta_json(const ChatDelta& delta) const {
  nlohmann::json out = nlohmann::json::object();
  if (!delta.reasoning.empty()) out["reasoning_content"] = delta.reasoning;
  if (!delta.content.empty()) out["content"] = delta.content;
  if (delta.calls.empty()) return out;
  nlohmann::json calls = nlohmann::json::array();
  for (const ToolCallDelta& d : delta.calls) {
    nlohmann::json call = {{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
    if (!d.id.empty()) {  // a call's first delta: OpenAI sends its id, type and name with it
      call["id"] = d.id;
      call["type"] = "function";
      call["function"]["name"] = d.name;
    }
    calls.push_back(std::move(call));
  }
  out["tool_calls"] = std::move(calls);
  return out;
}

nlohmann::json ResponseFormatter::chat_finish_json(FinishReason reason, int num_calls) const {
  if (reason == FinishReason::kStop && num_calls > 0) return "tool_calls";
  return finish_json(reason);
}

std::string ResponseFormatter::stream_delta(int index, const RequestOutput& delta, ChoiceState& state) const {
  state.absorb(delta, /*keep_tokens=*/false);
  const bool has_logprobs = logprobs_ && !delta.tokens.empty();
  if (endpoint_ == Endpoint::kChatCompletions) {
    if (!state.parser) state.parser.emplace(chat_output_);
    ChatDelta parsed = state.parser->push(delta.text);
    if (delta.finished) parsed.append(state.parser->flush());
    if (parsed.empty() && !delta.finished && !has_logprobs) return "";
    nlohmann::json logprobs = has_logprobs ? logprobs_json(delta.tokens, state.text_offset) : nlohmann::json(nullptr);
    const nlohmann::json finish =
        delta.finished ? chat_finish_json(delta.finish_reason, state.parser->num_calls()) : nlohmann::json(nullptr);
    nlohmann::json choice = {{"index", index},
                             {"delta", chat_delta_json(parsed)},
                             {"logprobs", std::move(logprobs)},
                             {"finish_reason", finish}};
    if (delta.finished) choice["stop_reason"] = stop_reason_json(state);
    return sse_event(with_chain_status(chunk(std::move(choice)), state));
  }
  if (delta.text.empty() && !delta.finished && !has_logprobs) return "";
  nlohmann::json logprobs = has_logprobs ? logprobs_json(delta.tokens, state.text_offset) : nlohmann::json(nullptr);
  const nlohmann::json finish = delta.finished ? finish_json(delta.finish_reason) : nlohmann::json(nullptr);
  return sse_event(with_chain_status(
      chunk({{"index", index},
             {"text", delta.text},
             {"logprobs", std::move(logprobs)},
             {"finish_reason", finish},
             {"stop_reason", delta.finished ? stop_reason_json(state) : nlohmann::json(nullptr)}}),
      state));
}

std::string ResponseFormatter::stream_end(const Usage& usage) const {
  std::string events;
  if (include_usage_) {
    nlohmann::json last = chunk(nullptr);
    last["choices"] = nlohmann::json::array();
    last["usage"] = usage.to_json();
    events += sse_event(last);
  }
  events += kSseDone;
  return events;
}

nlohmann::json ResponseFormatter::full_response(std::span<const ChoiceState> choices) const {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  nlohmann::json out_choices = nlohmann::json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = choices[i];
    size_t text_offset = 0;
    nlohmann::json logprobs = logprobs_ ? logprobs_json(c.tokens, text_offset) : nlohmann::json(nullptr);
    nlohmann::json choice = {{"index", i}, {"logprobs", std::move(logprobs)},
                             {"finish_reason", finish_json(c.finish_reason)}, {"stop_reason", stop_reason_json(c)}};
    if (chat) {
      ChatOutputParser parser(chat_output_);
      ChatDelta message = parser.push(c.text);
      message.append(parser.flush());
      // As vLLM: no content is null when the text went to reasoning or tool calls.
      const bool no_content = message.content.empty() && (!message.reasoning.empty() || !message.calls.empty());
      choice["message"] = {{"role", "assistant"},
                           {"content", no_content ? nlohmann::json(nullptr) : nlohmann::json(message.content)}};
      if (chat_output_.reasoning)
        choice["message"]["reasoning_content"] =
            message.reasoning.empty() ? nlohmann::json(nullptr) : nlohmann::json(message.reasoning);
      if (!message.calls.empty()) choice["message"]["tool_calls"] = tool_calls_json(message.calls);
      choice["finish_reason"] = chat_finish_json(c.finish_reason, parser.num_calls());
    } else {
      choice["text"] = c.text;
    }
    out_choices.push_back(std::move(choice));
  }
  nlohmann::json out = {{"id", id_},
                        {"object", chat ? "chat.completion" : "text_completion"},
                        {"created", created_},
                        {"model", model_},
                        {"choices", std::move(out_choices)},
                        {"usage", usage_of(choices).to_json()}};
  if (!chain_id_.empty() && !choices.empty()) {
    out["chain_id"] = chain_id_;
    out["chain_status"] = chain_status_name(choices.front().chain_status);
  }
  return out;
}

}  // namespace se::server
