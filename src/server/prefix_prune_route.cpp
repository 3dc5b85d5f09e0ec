#include "server/prefix_prune_route.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>

#include "server/generation_route.h"
#include "server/json_fields.h"
#include "server/openai_response.h"
#include "server/prefix_cache_route.h"

namespace se::server {

namespace {

// "ranges": [[L, R], ...], or "range_start" and "range_end" for one range.
ApiResult<std::vector<TokenRange>> body_ranges(const nlohmann::json& body) {
  const FieldReader fields(body);
  SE_API_ASSIGN_OR_RETURN(auto start, fields.get_int("range_start", 0, INT32_MAX));
  SE_API_ASSIGN_OR_RETURN(auto end, fields.get_int("range_end", 0, INT32_MAX));
  const nlohmann::json* list = fields.find("ranges");
  if (list != nullptr && (start || end))
    return ApiError::bad_request("give 'ranges' or 'range_start' and 'range_end', not both", "ranges");
  if (list == nullptr) {
    if (!start || !end) return ApiError::bad_request("'range_start' and 'range_end' (or 'ranges') are required",
                                                     start ? "range_end" : "range_start");
    return std::vector<TokenRange>{{static_cast<int32_t>(*start), static_cast<int32_t>(*end)}};
  }
  if (!list->is_array() || list->empty())
    return ApiError::bad_request("'ranges' must be a non-empty list of [start, end] pairs", "ranges");
  std::vector<TokenRange> ranges;
  for (const nlohmann::json& pair : *list) {
    const bool valid = pair.is_array() && pair.size() == 2 && pair[0].is_number_integer() &&
                       pair[1].is_number_integer() && pair[0].get<int64_t>() >= 0 && pair[1].get<int64_t>() >= 0 &&
                       pair[0].get<int64_t>() <= INT32_MAX && pair[1].get<int64_t>() <= INT32_MAX;
    if (!valid)
      return ApiError::bad_request(fmt::format("'ranges' entries must be [start, end] pairs of non-negative "
                                               "integers, got {}", pair.dump()),
                                   "ranges");
    ranges.push_back({pair[0].get<int32_t>(), pair[1].get<int32_t>()});
  }
  return ranges;
}

ApiResult<PruneRequest> parse_prune_request(const ServerContext& ctx, const nlohmann::json& body) {
  if (!body.is_object()) return ApiError::bad_request("the body must be a JSON object");
  const FieldReader fields(body);
  PruneRequest request;
  SE_API_ASSIGN_OR_RETURN(auto chain_id, fields.get_string("chain_id"));
  if (chain_id) {
    if (chain_id->empty()) return ApiError::bad_request("'chain_id' must not be empty", "chain_id");
    request.chain_id = *chain_id;
  }
  SE_API_ASSIGN_OR_RETURN(request.token_ids, body_tokens(ctx, body));
  if (request.token_ids.empty() && request.chain_id.empty())
    return ApiError::bad_request("'token_ids', 'text' or 'chain_id' is required", "token_ids");
  SE_API_ASSIGN_OR_RETURN(request.ranges, body_ranges(body));
  SE_API_ASSIGN_OR_RETURN(auto keep, fields.get_int("keep_tokens", 0, INT32_MAX));
  if (!keep) return ApiError::bad_request("'keep_tokens' is required", "keep_tokens");
  request.keep_tokens = static_cast<int32_t>(*keep);
  SE_API_ASSIGN_OR_RETURN(auto policy_name, fields.get_string("policy"));
  if (!policy_name) return ApiError::bad_request("'policy' is required (snapkv_global or kvzip_global)", "policy");
  const std::optional<PrunePolicy> policy = parse_prune_policy(*policy_name);
  if (!policy)
    return ApiError::bad_request(
        fmt::format("'policy' must be snapkv_global or kvzip_global, got '{}'", *policy_name), "policy");
  request.policy = *policy;
  SE_API_ASSIGN_OR_RETURN(auto window, fields.get_int("window", 1, 1 << 16));
  if (window) request.window = static_cast<int32_t>(*window);
  const Status valid = validate_prune_request(request);
  if (!valid.is_ok()) {
    const bool keep_too_large = std::any_of(request.ranges.begin(), request.ranges.end(), [&](const TokenRange& r) {
      return r.start < r.end && request.keep_tokens > r.end - r.start;
    });
    return ApiError::bad_request(valid.message(), keep_too_large ? "keep_tokens" : "ranges");
  }
  return request;
}

nlohmann::json status_json(const PruneStatus& status) {
  nlohmann::json out = {{"prune_id", status.prune_id}, {"status", prune_state_name(status.state)}};
  if (status.state == PruneState::kBlocked || status.state == PruneState::kFailed) out["reason"] = status.reason;
  if (status.state != PruneState::kCompleted) return out;
  nlohmann::json ranges = nlohmann::json::array();
  for (const PrunedRange& r : status.ranges) {
    ranges.push_back({{"range", {r.requested.start, r.requested.end}},
                      {"effective_range", {r.effective.start, r.effective.end}},
                      {"kept_tokens", r.kept_positions.size()},
                      {"kept_positions", r.kept_positions},
                      {"pages_freed", r.num_freed_pages}});
  }
  out["ranges"] = std::move(ranges);
  out["pages_freed"] = status.num_freed_pages;
  return out;
}

}  // namespace

void handle_prefix_cache_prune(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  ApiResult<nlohmann::json> body = parse_json_body(req.body);
  if (!body.is_ok()) return send_error(res, body.error());
  ApiResult<PruneRequest> request = parse_prune_request(ctx, body.value());
  if (!request.is_ok()) return send_error(res, request.error());
  Result<std::string> prune_id = ctx.engine.submit_prune(std::move(request).value());
  if (!prune_id.is_ok()) return send_error(res, ApiError::from_status(prune_id.status()));
  res.status = 202;
  res.set_content(dump_json({{"prune_id", *prune_id}, {"status", "queued"}}), "application/json");
}

void handle_prefix_cache_prune_status(ServerContext& ctx, const std::string& prune_id, httplib::Response& res) {
  std::optional<PruneStatus> status = ctx.engine.prune_status(prune_id);
  if (!status)
    return send_error(res, ApiError{404, fmt::format("prune '{}' does not exist or was forgotten", prune_id),
                                    "prune_id"});
  res.set_content(dump_json(status_json(*status)), "application/json");
}

}  // namespace se::server
