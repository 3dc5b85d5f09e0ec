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

nlohmann::json radix_json(const PrefixCacheInspection& inspection) {
  nlohmann::json segments = nlohmann::json::array();
  for (const TokenRange& r : inspection.pruned_segments) segments.push_back({r.start, r.end});
  return {{"cache", "radix"},
          {"cached_tokens", inspection.num_cached_tokens},
          {"resident_tokens", inspection.num_resident_tokens},
          {"pruned_segments", std::move(segments)}};
}

// The radix cache's answer for the body's tokens (as a prompt: what a request would reuse), or the error.
ApiResult<nlohmann::json> inspect_radix(ServerContext& ctx, const nlohmann::json& body, bool as_prompt) {
  SE_API_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, body_tokens(ctx, body));
  if (tokens.empty()) return ApiError::bad_request("give 'chain_id', or 'token_ids' or 'text'", "token_ids");
  Result<PrefixCacheInspection> inspection = ctx.engine.inspect_prefix(std::move(tokens), as_prompt);
  if (!inspection.is_ok()) {
    if (inspection.status().code() == StatusCode::kUnimplemented)
      return ApiError::bad_request(fmt::format("this server runs prefix cache mode {}, without a radix prefix "
                                               "cache: {}", ctx.engine.config().prefix_cache_mode,
                                               inspection.status().message()),
                                   "token_ids");
    return ApiError::from_status(inspection.status());
  }
  return radix_json(*inspection);
}

// Radix routes answer bodies without a chain_id.
bool names_chain(const nlohmann::json& body) {
  return body.is_object() && body.contains("chain_id") && !body["chain_id"].is_null();
}

}  // namespace

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

void handle_prefix_cache_inspect(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  ApiResult<nlohmann::json> body = parse_json_body(req.body);
  if (!body.is_ok()) return send_error(res, body.error());
  if (!names_chain(body.value())) {
    ApiResult<nlohmann::json> out = inspect_radix(ctx, body.value(), /*as_prompt=*/false);
    if (!out.is_ok()) return send_error(res, out.error());
    return res.set_content(dump_json(out.value()), "application/json");
  }
  ApiResult<ChainInfo> info = find_chain(ctx, body.value());
  if (!info.is_ok()) return send_error(res, info.error());
  nlohmann::json out = chain_json(info.value());
  out["token_ids"] = ctx.engine.chain_prefix(info->chain_id);  // empty while a turn is in flight
  res.set_content(dump_json(out), "application/json");
}

void handle_prefix_cache_match(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  ApiResult<nlohmann::json> body = parse_json_body(req.body);
  if (!body.is_ok()) return send_error(res, body.error());
  if (!names_chain(body.value())) {
    ApiResult<nlohmann::json> out = inspect_radix(ctx, body.value(), /*as_prompt=*/true);
    if (!out.is_ok()) return send_error(res, out.error());
    return res.set_content(dump_json(out.value()), "application/json");
  }
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
