#include "server/tokenize_route.h"

#include <httplib.h>

#include "server/generation_route.h"
#include "server/json_fields.h"
#include "server/openai_response.h"

namespace se::server {

namespace {

ApiResult<std::vector<int32_t>> tokenize(const ServerContext& ctx, const nlohmann::json& body) {
  const ModelBundle& bundle = ctx.engine.bundle();
  const bool chat = body.contains("messages");
  SE_API_ASSIGN_OR_RETURN(auto add_generation_prompt, FieldReader(body).get_bool("add_generation_prompt"));
  // add_generation_prompt is this route's own field; the rest is a generation body.
  nlohmann::json generation_body = body;
  if (chat) generation_body.erase("add_generation_prompt");
  SE_API_ASSIGN_OR_RETURN(OpenAiRequest request, chat ? parse_chat_request(generation_body, ctx.limits)
                                                      : parse_completion_request(generation_body, ctx.limits));
  if (!chat || add_generation_prompt.value_or(true)) return prompt_token_ids(request, bundle);
  if (!bundle.tokenizer) return ApiError::bad_request("this model has no tokenizer", "messages");
  Result<std::string> rendered =
      bundle.render_chat(request.messages, /*add_generation_prompt=*/false, request.chat_extras);
  if (!rendered.is_ok()) return ApiError::from_status(rendered.status(), "messages");
  return bundle.tokenizer->encode(*rendered, /*add_special=*/false, /*parse_special=*/true);
}

}  // namespace

void handle_tokenize(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  ApiResult<nlohmann::json> body = parse_json_body(req.body);
  if (!body.is_ok()) return send_error(res, body.error());
  ApiResult<std::vector<int32_t>> tokens = tokenize(ctx, body.value());
  if (!tokens.is_ok()) return send_error(res, tokens.error());
  const nlohmann::json out = {
      {"count", tokens->size()}, {"max_model_len", ctx.max_model_len}, {"tokens", tokens.value()}};
  res.set_content(dump_json(out), "application/json");
}

}  // namespace se::server
