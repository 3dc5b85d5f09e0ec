#include "server/prefix_cache_route.h"

#include <fmt/format.h>
#include <httplib.h>

#include <cstdint>

#include "server/generation_route.h"
#include "server/json_fields.h"
#include "server/openai_response.h"

namespace se::server {

namespace {

// The body's chain, or the error that answers the request (400 bad body, 404 unknown or reclaimed chain).
ApiResult<ChainInfo> find_chain(ServerContext& ctx, const nlohmann::json& body) {
  const FieldReader fields(body);
  SE_API_ASSIGN_OR_RETURN(auto chain_id, fields.get_string("chain_id"));
  if (!chain_id) return ApiError::bad_request("'chain_id' is required", "chain_id");
  std::optional<ChainInfo> info = ctx.engine.find_chain(*chain_id);
  if (info) return *info;
  if (ctx.engine.config().prefix_cache_mode != "chain")
    return ApiError::bad_request(fmt::format("this server runs prefix cache mode {}, without chains",
                                             ctx.engine.config().prefix_cache_mode),
                                 "chain_id");
  return ApiError{404, fmt::format("chain '{}' does not exist or was reclaimed", *chain_id), "chain_id"};
}

nlohmann::json chain_json(const ChainInfo& info) {
  return {{"chain_id", info.chain_id},
          {"status", info.in_flight ? "in_flight" : "idle"},
          {"num_tokens", info.num_prefix_tokens},
          {"num_held_pages", info.num_held_pages},
          {"digest", fmt::format("{:016x}", info.digest)}};
}

// token_ids (a list of ids) or text (encoded as a completions prompt is).
ApiResult<std::vector<int32_t>> body_tokens(const ServerContext& ctx, const nlohmann::json& body) {
  const FieldReader fields(body);
  SE_API_ASSIGN_OR_RETURN(std::vector<int64_t> ids, fields.get_int_list("token_ids", 0, INT32_MAX));
  SE_API_ASSIGN_OR_RETURN(auto text, fields.get_string("text"));
  if (!ids.empty() && text) return ApiError::bad_request("give 'token_ids' or 'text', not both", "text");
  if (!text) return std::vector<int32_t>(ids.begin(), ids.end());
  const ModelBundle& bundle = ctx.engine.bundle();
  if (!bundle.tokenizer) return ApiError::bad_request("this model has no tokenizer: send 'token_ids'", "text");
  return bundle.tokenizer->encode(*text, /*add_special=*/true, /*parse_special=*/true);
}

}  // namespace

void handle_prefix_cache_inspect(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  ApiResult<nlohmann::json> body = parse_json_body(req.body);
  if (!body.is_ok()) return send_error(res, body.error());
  ApiResult<ChainInfo> info = find_chain(ctx, body.value());
  if (!info.is_ok()) return send_error(res, info.error());
  nlohmann::json out = chain_json(info.value());
  out["token_ids"] = ctx.engine.chain_prefix(info->chain_id);  // empty while a turn is in flight
  res.set_content(dump_json(out), "application/json");
}

void handle_prefix_cache_match(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  ApiResult<nlohmann::json> body = parse_json_body(req.body);
  if (!body.is_ok()) return send_error(res, body.error());
  ApiResult<ChainInfo> info = find_chain(ctx, body.value());
  if (!info.is_ok()) return send_error(res, info.error());
  ApiResult<std::vector<int32_t>> tokens = body_tokens(ctx, body.value());
  if (!tokens.is_ok()) return send_error(res, tokens.error());
  const auto num_cached = static_cast<size_t>(info->num_prefix_tokens);
  const std::span<const int32_t> prompt(tokens.value());
  const bool extends = !info->in_flight && prompt.size() > num_cached &&
                       token_digest(prompt.first(num_cached)) == info->digest;
  nlohmann::json out = chain_json(info.value());
  out["extends"] = extends;
  // The last cached token was sampled but never computed: a resumed turn computes it first.
  out["cached_tokens"] = extends ? static_cast<int>(num_cached) - 1 : 0;
  res.set_content(dump_json(out), "application/json");
}

}  // namespace se::server
