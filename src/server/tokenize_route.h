// POST /tokenize, as vLLM serves it: {"prompt"} (encoded as a completions prompt is) or {"messages",
// "add_generation_prompt" (default true)} (rendered with the chat template, as chat requests are) -> {"tokens",
// "count", "max_model_len"}. What a client needs to name token ranges of its own prompts (prefix pruning). Called
// on HTTP worker threads.
#pragma once

#include "server/server_context.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace se::server {

void handle_tokenize(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);

}  // namespace se::server
