// The POST /v1/completions and /v1/chat/completions handler: body -> OpenAiRequest -> prompt token ids (the
// tokenizer, or the chat template then the tokenizer) -> context-length check -> GenerationSession -> response.
// Every response, streamed or not, is written by a chunked content provider that polls the client between
// deltas, so a client that disconnects aborts its engine requests. Called on HTTP worker threads.
#pragma once

#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/server_context.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace se::server {

// The prompt's token ids: completions encode their text with the model's special tokens added and special
// tokens in the text parsed (as vLLM); chat renders the model's template and encodes it as is.
ApiResult<std::vector<int32_t>> prompt_token_ids(const OpenAiRequest& request, const ModelBundle& bundle);

// Writes the whole answer (or an OpenAI-shaped error) into `res`.
void handle_generation(ServerContext& ctx, Endpoint endpoint, const httplib::Request& req, httplib::Response& res);

// Sets an error response.
void send_error(httplib::Response& res, const ApiError& error);

}  // namespace se::server
