// The prefix caches' read-only routes, so an application can see what is cached:
//   POST /v1/prefix_cache/inspect {"chain_id"} -> the chain's state: idle or in_flight, its cached tokens (their
//     count and, when idle, their ids), the pages it holds and its digest (404 unknown or reclaimed);
//   POST /v1/prefix_cache/match {"chain_id", "token_ids" | "text"} -> whether that prompt extends the chain and
//     how many of its tokens a turn would resume instead of prefilling (the digest check the engine makes).
//   Without "chain_id", both ask the radix prefix cache about "token_ids" | "text": the logical tokens of its
//     longest cached prefix (inspect: every whole block; match: what a request with that prompt would reuse),
//     the tokens whose KV is resident, and the pruned segments inside it. The engine thread answers between
//     steps (the tree is its own).
// Nothing is pinned or changed. Called on HTTP worker threads.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/server_context.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace se::server {

// A body's "token_ids" (a list of ids) or "text" (encoded as a completions prompt is); empty when neither.
ApiResult<std::vector<int32_t>> body_tokens(const ServerContext& ctx, const nlohmann::json& body);

void handle_prefix_cache_inspect(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_prefix_cache_match(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);

}  // namespace se::server
