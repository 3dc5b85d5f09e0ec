#include "server/generation_route.h"

#include <fmt/format.h>
#include <httplib.h>

#include <ctime>
#include <memory>
#include <random>

#include "base/logging.h"
#include "server/chain_append.h"
#include "server/generation_session.h"
#include "server/openai_response.h"
#include "server/structured_request.h"
#include "structured/grammar_matcher.h"

namespace se::server {

namespace {

// How long a provider call waits for a delta before it checks the client again.
constexpr std::chrono::milliseconds kClientPollInterval{100};

std::string random_hex(int num_chars) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (static_cast<int>(out.size()) < num_chars) out += fmt::format("{:016x}", rng());
  out.resize(static_cast<size_t>(num_chars));
  return out;
}

// Everything one response needs while httplib streams it. Holding it keeps the request counted in flight;
// dropping it (response written, or client gone) aborts what still runs.
struct ResponseState {
  ResponseState(ServerContext& ctx, ResponseFormatter formatter) : ctx(ctx), formatter(std::move(formatter)) {
    ctx.inflight.add();
  }
  ~ResponseState() {
    session.reset();  // aborts unfinished choices before the drain waiter may see zero
    ctx.inflight.remove();
  }
  ResponseState(const ResponseState&) = delete;
  ResponseState& operator=(const ResponseState&) = delete;

  ServerContext& ctx;
  ResponseFormatter formatter;
  std::unique_ptr<GenerationSession> session;
  std::vector<ChoiceState> choices;
  bool logprobs = false;
  bool started = false;
  std::optional<double> timeout_s;  // the request's "timeout", counted from its submission to the engine
  std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();

  bool timed_out() const {
    return timeout_s && std::chrono::steady_clock::now() - submitted >= std::chrono::duration<double>(*timeout_s);
  }
  // Aborts the choices (the engine frees their pages at its next step) and says why.
  ApiError abort_for_timeout() {
    session.reset();
    return ApiError{408, fmt::format("the request timed out after {} s and was aborted", *timeout_s), "timeout"};
  }
};

// The error a choice that ended without stop/length reports.
ApiError ended_early(const RequestOutput& out) {
  if (out.finish_reason == FinishReason::kAbort)
    return ApiError{503, "the request was aborted: the server is shutting down", ""};
  return ApiError{500, out.error.empty() ? std::string("the engine failed on this request") : out.error, ""};
}

bool failed(const RequestOutput& out) {
  return out.finished && (out.finish_reason == FinishReason::kAbort || out.finish_reason == FinishReason::kError);
}

bool write(httplib::DataSink& sink, const std::string& data) {
  return data.empty() || sink.write(data.data(), data.size());
}

// One provider call: wait for a delta, send its SSE events; close with usage and [DONE] once all choices end.
// A timeout ends the stream with an error event and [DONE].
bool provide_stream(ResponseState& s, httplib::DataSink& sink) {
  if (!s.started) {
    s.started = true;
    if (!write(sink, s.formatter.stream_start(s.session->num_choices()))) return false;
  }
  if (!sink.is_writable()) return false;  // the client went away: dropping the state aborts the choices
  if (s.timed_out()) {
    if (!write(sink, sse_event(s.abort_for_timeout().to_json())) || !write(sink, std::string(kSseDone)))
      return false;
    sink.done();
    return true;
  }
  std::optional<ChoiceDelta> delta = s.session->next(kClientPollInterval);
  if (!delta) return true;
  if (failed(delta->output)) {
    if (!write(sink, sse_event(ended_early(delta->output).to_json())) || !write(sink, std::string(kSseDone)))
      return false;
    sink.done();
    return true;
  }
  ChoiceState& choice = s.choices[static_cast<size_t>(delta->index)];
  if (!write(sink, s.formatter.stream_delta(delta->index, delta->output, choice))) return false;
  if (s.session->finished()) {
    if (!write(sink, s.formatter.stream_end(usage_of(s.choices)))) return false;
    sink.done();
  }
  return true;
}

// Waits for the next delta and adds it to its choice; the error to answer with when the choice failed.
std::optional<ApiError> absorb_next(ResponseState& s) {
  std::optional<ChoiceDelta> delta = s.session->next(kClientPollInterval);
  if (!delta) return std::nullopt;
  if (failed(delta->output)) return ended_early(delta->output);
  s.choices[static_cast<size_t>(delta->index)].absorb(delta->output, s.logprobs);
  return std::nullopt;
}

// One provider call of a non-streaming response: collect deltas; send the body once all choices end. The
// status line is already out, so a choice that fails cuts the connection rather than claim success.
bool provide_full(ResponseState& s, httplib::DataSink& sink) {
  if (!sink.is_writable()) return false;
  if (std::optional<ApiError> error = absorb_next(s)) {
    SE_LOG_WARN("request failed after its response started: {}", error->message);
    return false;
  }
  if (s.session->finished()) {
    if (!write(sink, dump_json(s.formatter.full_response(s.choices)))) return false;
    sink.done();
  }
  return true;
}

// A non-streaming request with a timeout is collected before the status line goes out, so that a timeout can
// answer 408. Its worker does not watch the client meanwhile; the timeout bounds how long a gone client's
// choices run.
void collect_before_status(ResponseState& s, httplib::Response& res) {
  while (!s.session->finished()) {
    if (s.timed_out()) return send_error(res, s.abort_for_timeout());
    if (std::optional<ApiError> error = absorb_next(s)) return send_error(res, *error);
  }
  res.set_content(dump_json(s.formatter.full_response(s.choices)), "application/json");
}

// Checks a request's tools against the model and the server, and sets the grammar that constrains its output
// (response_format, or a required tool call).
std::optional<ApiError> prepare_constraints(const ServerContext& ctx, OpenAiRequest& request) {
  const ModelBundle& bundle = ctx.engine.bundle();
  std::optional<JsonGrammar> grammar = std::move(request.response_grammar);
  if (!request.chat_extras.tools.is_null()) {
    if (!bundle.chat_template_supports_tools())
      return ApiError::bad_request(fmt::format("model '{}' has a chat template without tool support: 'tools' cannot "
                                               "be used (serve it with a --chat-template that renders tools)",
                                               bundle.name),
                                   "tools");
    if (request.tool_choice != ToolChoice::kNone && !ctx.config.tool_call_format)
      return ApiError::bad_request(
          "tool calls need the server started with --tool-call-parser (hermes or "
          "llama3_json); send tool_choice \"none\" to only show the tools",
          "tool_choice");
    if (request.tool_choice == ToolChoice::kRequired || request.tool_choice == ToolChoice::kNamed) {
      ApiResult<JsonGrammar> call = required_call_grammar(request, *ctx.config.tool_call_format);
      if (!call.is_ok()) return call.error();
      grammar = std::move(call).value();
    }
  }
  if (!grammar) return std::nullopt;
  if (!ctx.vocab || !bundle.tokenizer)
    return ApiError::bad_request(
        fmt::format("model '{}' has no tokenizer: its output cannot be constrained", bundle.name), "response_format");
  request.params.grammar =
      std::make_shared<const TokenGrammar>(TokenGrammar{std::move(*grammar), ctx.vocab, bundle.tokenizer->eog_ids()});
  return std::nullopt;
}

}  // namespace

void send_error(httplib::Response& res, const ApiError& error) {
  res.status = error.http_status;
  res.set_content(error.body(), "application/json");
}

ApiResult<std::vector<int32_t>> prompt_token_ids(const OpenAiRequest& request, const ModelBundle& bundle) {
  const bool chat = request.endpoint == Endpoint::kChatCompletions;
  if (!chat && !request.prompt_text) return request.prompt_ids;
  if (!bundle.tokenizer)
    return ApiError::bad_request(fmt::format("model '{}' has no tokenizer: send the prompt as token ids",
                                             bundle.name),
                                 chat ? "messages" : "prompt");
  std::vector<int32_t> ids;
  if (chat) {
    Result<std::string> rendered =
        bundle.render_chat(request.messages, /*add_generation_prompt=*/true, request.chat_extras);
    if (!rendered.is_ok()) return ApiError::from_status(rendered.status(), "messages");
    ids = bundle.tokenizer->encode(*rendered, /*add_special=*/false, /*parse_special=*/true);
  } else {
    ids = bundle.tokenizer->encode(*request.prompt_text, /*add_special=*/true, /*parse_special=*/true);
  }
  if (ids.empty()) return ApiError::bad_request("the prompt is empty", chat ? "messages" : "prompt");
  return ids;
}

void handle_generation(ServerContext& ctx, Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
  if (ctx.draining) return send_error(res, ApiError{503, "the server is shutting down", ""});
  // Engine stats trail the queue by up to one step, so concurrent arrivals may pass the bound by a few.
  const int max_waiting = ctx.config.max_waiting_requests;
  if (max_waiting > 0 && ctx.engine.stats().num_waiting >= max_waiting) {
    res.set_header("Retry-After", "1");
    return send_error(res, ApiError{503, fmt::format("the server's queue is full ({} requests waiting): retry "
                                                     "later",
                                                     max_waiting),
                                    ""});
  }
  ApiResult<nlohmann::json> body = parse_json_body(req.body);
  if (!body.is_ok()) return send_error(res, body.error());
  const bool chat = endpoint == Endpoint::kChatCompletions;
  // Schemas keep their key order: constrained output writes properties in it.
  const bool has_schemas = body->contains("tools") || body->contains("response_format");
  const nlohmann::ordered_json ordered_body =
      has_schemas ? nlohmann::ordered_json::parse(req.body, nullptr, false) : nlohmann::ordered_json();
  const nlohmann::ordered_json* ordered = has_schemas ? &ordered_body : nullptr;
  ApiResult<OpenAiRequest> parsed = chat ? parse_chat_request(body.value(), ctx.limits, ordered)
                                         : parse_completion_request(body.value(), ctx.limits, ordered);
  if (!parsed.is_ok()) return send_error(res, parsed.error());
  OpenAiRequest& request = parsed.value();

  const ModelBundle& bundle = ctx.engine.bundle();
  if (!request.model.empty() && request.model != bundle.name)
    return send_error(res, ApiError{404, fmt::format("The model `{}` does not exist.", request.model), "model"});
  if (std::optional<ApiError> error = prepare_constraints(ctx, request)) return send_error(res, *error);
  std::optional<ChainRequest> chain;
  if (request.chain) {
    const bool create = request.chain_id.empty();
    chain = ChainRequest{create ? "chain-" + random_hex(24) : request.chain_id, create};
  }
  // An append continues from the chain's stored tokens; without them (unknown, busy, reclaimed chain) the full
  // rendering goes to the engine, which answers why the chain cannot be continued.
  const std::vector<int32_t> chain_tokens =
      request.chain_append_start ? ctx.engine.chain_prefix(request.chain_id) : std::vector<int32_t>();
  ApiResult<std::vector<int32_t>> prompt =
      chain_tokens.empty() ? prompt_token_ids(request, bundle)
                           : chain_append_prompt(bundle, request.messages, *request.chain_append_start, chain_tokens,
                                                 request.chat_extras);
  if (!prompt.is_ok()) return send_error(res, prompt.error());
  ApiResult<int> max_tokens = resolve_max_tokens(request, static_cast<int>(prompt->size()), ctx.max_model_len);
  if (!max_tokens.is_ok()) return send_error(res, max_tokens.error());
  request.params.max_tokens = max_tokens.value();

  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(32);
  TokenBytesFn token_bytes = [&bundle](int32_t token_id) {
    return bundle.tokenizer ? std::string(bundle.tokenizer->token_bytes(token_id)) : std::string();
  };
  auto state = std::make_shared<ResponseState>(
      ctx, ResponseFormatter(endpoint, id, bundle.name, static_cast<int64_t>(std::time(nullptr)), request.logprobs,
                             request.include_usage, std::move(token_bytes)));
  if (chain) state->formatter.set_chain_id(chain->chain_id);
  if (chat) {
    const bool calls = !request.chat_extras.tools.is_null() && request.tool_choice != ToolChoice::kNone;
    // Constrained output (response_format, a required call) is the answer itself: all of it is content.
    state->formatter.set_chat_output({request.params.grammar ? std::nullopt : ctx.config.reasoning_format,
                                      calls ? ctx.config.tool_call_format : std::nullopt,
                                      "call_" + random_hex(24) + "_"});
  }
  Result<std::unique_ptr<GenerationSession>> session =
      GenerationSession::submit(ctx.engine, id, prompt.value(), request.params, request.n, chain);
  if (!session.is_ok()) return send_error(res, ApiError::from_status(session.status(), chain ? "chain_id" : ""));
  state->session = std::move(session).value();
  state->choices.resize(static_cast<size_t>(request.n));
  state->logprobs = request.logprobs;
  state->timeout_s = request.timeout_s;

  res.status = 200;
  if (chain) res.set_header("X-SparseVLLM-Chain-ID", chain->chain_id);
  if (request.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [state](size_t, httplib::DataSink& sink) { return provide_stream(*state, sink); },
        [state](bool) { state->session.reset(); });
  } else if (request.timeout_s) {
    collect_before_status(*state, res);
  } else {
    res.set_chunked_content_provider(
        "application/json", [state](size_t, httplib::DataSink& sink) { return provide_full(*state, sink); },
        [state](bool) { state->session.reset(); });
  }
}

}  // namespace se::server
