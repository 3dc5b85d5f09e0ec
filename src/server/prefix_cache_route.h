// The Chain Cache's read-only routes, so an application can see what is cached for a conversation:
//   POST /v1/prefix_cache/inspect {"chain_id"} -> the chain's state: idle or in_flight, its cached tokens (their
//     count and, when idle, their ids), the pages it holds and its digest (404 unknown or reclaimed);
//   POST /v1/prefix_cache/match {"chain_id", "token_ids" | "text"} -> whether that prompt extends the chain and
//     how many of its tokens a turn would resume instead of prefilling (the digest check the engine makes).
// Nothing is pinned or changed. Radix-cache inspection is not offered (its tree belongs to the engine thread).
// Called on HTTP worker threads.
#pragma once

#include "server/server_context.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace se::server {

void handle_prefix_cache_inspect(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_prefix_cache_match(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);

}  // namespace se::server
