// The prefix-pruning routes (wire-compatible with SparseEngine's):
//   POST /v1/prefix_cache/prune {"token_ids" | "text" | "chain_id", "range_start" + "range_end" |
//     "ranges": [[L, R], ...], "keep_tokens", "policy": "snapkv_global" | "kvzip_global", "window" (snapkv_global,
//     default 32)} -> 202 {"prune_id", "status": "queued"}; 400 for a bad body (ranges are half-open and 0-based,
//     inside the tokens, ascending without overlap; 0 <= keep_tokens <= each range's size) or a chain_id on a
//     server without Chain Cache. With "chain_id" the ranges are positions of the chain's logical prefix (tokens,
//     if given, must be its start); the chain's retained state is pruned token by token (a chain with a turn in
//     flight: blocked).
//   GET /v1/prefix_cache/prune/{prune_id} -> {"prune_id", "status": queued | completed | blocked | failed,
//     "reason" (blocked, failed), "ranges": [{"range", "effective_range", "kept_tokens", "kept_positions",
//     "pages_freed"}], "pages_freed"} (completed); 404 for an unknown id.
// The engine thread runs each prune between steps (engine/prefix_prune_job.h). Called on HTTP worker threads.
#pragma once

#include "server/server_context.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace se::server {

void handle_prefix_cache_prune(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
// `prune_id` comes from the path.
void handle_prefix_cache_prune_status(ServerContext& ctx, const std::string& prune_id, httplib::Response& res);

}  // namespace se::server
