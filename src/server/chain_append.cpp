#include "server/chain_append.h"

#include <fmt/format.h>

namespace se::server {

ApiResult<std::vector<int32_t>> chain_append_prompt(const ModelBundle& bundle, const nlohmann::json& messages,
                                                    int append_start, const std::vector<int32_t>& chain_tokens,
                                                    const ChatExtras& extras) {
  constexpr const char* kParam = "chain_append_start";
  if (!bundle.tokenizer || !bundle.chat_template)
    return ApiError::bad_request(fmt::format("model '{}' has no chat template to append with", bundle.name), kParam);
  const nlohmann::json& reply = messages[static_cast<size_t>(append_start - 1)];
  if (reply.value("role", "") != "assistant" || !reply.contains("content") || !reply["content"].is_string() ||
      reply["content"].get<std::string>().empty())
    return ApiError::bad_request("the message before 'chain_append_start' must be the assistant reply (with text) "
                                 "that ended the chain's last turn", kParam);
  // What follows the reply's text in the whole conversation's rendering (its closing, the appended messages and
  // the generation prompt), found by rendering the conversation with a marker in the reply's place: a template may
  // render a reply differently once a later turn makes it history (Qwen3 drops a past reply's empty think block),
  // and the chain holds the reply as it was generated.
  constexpr std::string_view kMarker = "\x01chain-append-marker\x01";
  const std::string& text = reply["content"].get_ref<const std::string&>();
  nlohmann::json marked = messages;
  marked[static_cast<size_t>(append_start - 1)]["content"] = std::string(kMarker);
  Result<std::string> marked_render = bundle.render_chat(marked, /*add_generation_prompt=*/true, extras);
  if (!marked_render.is_ok()) return ApiError::from_status(marked_render.status(), "messages");
  Result<std::string> full = bundle.render_chat(messages, /*add_generation_prompt=*/true, extras);
  if (!full.is_ok()) return ApiError::from_status(full.status(), "messages");
  const size_t marker_at = marked_render->find(kMarker);
  if (marker_at == std::string::npos)
    return ApiError::bad_request("the chat template does not render the assistant reply verbatim", kParam);
  const std::string after_reply = marked_render->substr(marker_at + kMarker.size());
  if (!full->ends_with(text + after_reply))
    return ApiError::bad_request("the chat template does not render the assistant reply verbatim", kParam);
  // Less the end-of-turn token the model generated itself, which the chain already holds.
  std::string_view appended_text = after_reply;
  if (!chain_tokens.empty()) {
    const std::string_view last = bundle.tokenizer->token_bytes(chain_tokens.back());
    if (!last.empty() && appended_text.starts_with(last)) appended_text.remove_prefix(last.size());
  }
  const std::vector<int32_t> appended = bundle.tokenizer->encode(appended_text, /*add_special=*/false,
                                                                 /*parse_special=*/true);
  std::vector<int32_t> prompt = chain_tokens;
  prompt.insert(prompt.end(), appended.begin(), appended.end());
  return prompt;
}

}  // namespace se::server
