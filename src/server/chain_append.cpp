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
  nlohmann::json context_messages = nlohmann::json::array();
  for (int i = 0; i < append_start; ++i) context_messages.push_back(messages[static_cast<size_t>(i)]);
  Result<std::string> context = bundle.render_chat(context_messages, /*add_generation_prompt=*/false, extras);
  if (!context.is_ok()) return ApiError::from_status(context.status(), "messages");
  Result<std::string> full = bundle.render_chat(messages, /*add_generation_prompt=*/true, extras);
  if (!full.is_ok()) return ApiError::from_status(full.status(), "messages");
  if (full->compare(0, context->size(), *context) != 0)
    return ApiError::bad_request("the chat template does not render this conversation append-only", kParam);

  // What the template puts after the reply's text (e.g. "<|im_end|>\n"), less the end-of-turn token the model
  // generated itself, which the chain already holds.
  const std::string& text = reply["content"].get_ref<const std::string&>();
  const size_t at = context->rfind(text);
  if (at == std::string::npos)
    return ApiError::bad_request("the chat template does not render the assistant reply verbatim", kParam);
  std::string closing = context->substr(at + text.size());
  if (!chain_tokens.empty()) {
    const std::string_view last = bundle.tokenizer->token_bytes(chain_tokens.back());
    if (!last.empty() && closing.compare(0, last.size(), last) == 0) closing.erase(0, last.size());
  }
  const std::vector<int32_t> appended = bundle.tokenizer->encode(closing + full->substr(context->size()),
                                                                 /*add_special=*/false, /*parse_special=*/true);
  std::vector<int32_t> prompt = chain_tokens;
  prompt.insert(prompt.end(), appended.begin(), appended.end());
  return prompt;
}

}  // namespace se::server
