// OpenAI response bodies for /v1/completions and /v1/chat/completions: full responses, streaming SSE chunks
// (`data: {...}\n\n`, then `data: [DONE]\n\n`), usage, and logprobs in both formats (completions: the legacy
// tokens / token_logprobs / top_logprobs / text_offset lists; chat: the content list with bytes). ChoiceState
// accumulates one choice's deltas. One ResponseFormatter per HTTP request; not thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request_output.h"
#include "server/api_error.h"
#include "server/chat_output_parser.h"
#include "server/openai_request.h"

namespace se::server {

inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// JSON text for the wire: bytes that are not UTF-8 are replaced, never thrown on.
std::string dump_json(const nlohmann::json& value);
// One server-sent event: "data: <json>\n\n".
std::string sse_event(const nlohmann::json& value);

// "stop" or "length" (OpenAI's values); "abort" and "error" never reach a successful response.
std::string_view openai_finish_reason(FinishReason reason);

// The bytes a token id decodes to (Tokenizer::token_bytes in the server): they may be part of a UTF-8 sequence.
using TokenBytesFn = std::function<std::string(int32_t)>;

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache

  nlohmann::json to_json() const;
};

// What one choice has produced so far.
struct ChoiceState {
  std::string text;
  std::vector<TokenOutput> tokens;  // kept only when the request returns logprobs
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;  // the stop string that ended the choice
  int num_prompt_tokens = 0;
  int num_cached_tokens = 0;
  int num_output_tokens = 0;
  size_t text_offset = 0;  // completions logprobs: where the next token's text starts, in characters
  ChainStatus chain_status = ChainStatus::kNone;
  std::optional<ChatOutputParser> parser;  // chat streams: splits the deltas as they come

  bool finished() const { return finish_reason != FinishReason::kNone; }
  void absorb(const RequestOutput& delta, bool keep_tokens);
};

// Usage of a whole request: the prompt counted once, the completions of all choices summed.
Usage usage_of(std::span<const ChoiceState> choices);

class ResponseFormatter {
 public:
  // `id`: "cmpl-..." or "chatcmpl-..."; `created`: Unix seconds; `logprobs`: the request asked for them.
  ResponseFormatter(Endpoint endpoint, std::string id, std::string model, int64_t created, bool logprobs,
                    bool include_usage, TokenBytesFn token_bytes);

  // The events that open a stream: chat sends each choice's role first; completions send nothing.
  std::string stream_start(int num_choices) const;
  // The events for one delta of choice `index` (absorbed into `state`); "" when there is nothing to send.
  std::string stream_delta(int index, const RequestOutput& delta, ChoiceState& state) const;
  // The closing events: the usage chunk when asked for, then [DONE].
  std::string stream_end(const Usage& usage) const;

  // The non-streaming body.
  nlohmann::json full_response(std::span<const ChoiceState> choices) const;
  // A chain request's responses carry `chain_id` (every chunk) and `chain_status` (the body, the last chunk).
  void set_chain_id(std::string chain_id) { chain_id_ = std::move(chain_id); }
  // Chat: how the generated text splits into reasoning, content and tool calls.
  void set_chat_output(ChatOutputOptions options) { chat_output_ = std::move(options); }

  // Logprobs of `tokens` in the endpoint's format; `text_offset` (completions) advances past them.
  nlohmann::json logprobs_json(std::span<const TokenOutput> tokens, size_t& text_offset) const;

 private:
  nlohmann::json chunk(nlohmann::json choice) const;
  // `chunk` with the chain status once the choice finished (chain requests only).
  nlohmann::json with_chain_status(nlohmann::json chunk, const ChoiceState& state) const;
  nlohmann::json chat_logprob_entry(int32_t token_id, float logprob) const;
  // A chat stream's delta object for one parsed piece.
  nlohmann::json chat_delta_json(const ChatDelta& delta) const;
  // "tool_calls" when the choice stopped after calling tools, else OpenAI's name of `reason`.
  nlohmann::json chat_finish_json(FinishReason reason, int num_calls) const;

  Endpoint endpoint_;
  std::string id_;
  std::string model_;
  int64_t created_;
  bool logprobs_;
  bool include_usage_;
  TokenBytesFn token_bytes_;
  std::string chain_id_;  // empty: not a chain request
  ChatOutputOptions chat_output_;
};

}  // namespace se::server
