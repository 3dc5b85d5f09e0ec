// ChatTemplate: renders a model's chat template (the Jinja text from tokenizer_config.json or the
// GGUF key tokenizer.chat_template) for a conversation, producing the prompt text exactly as HF
// transformers' apply_chat_template(tokenize=False) does. Immutable after parse; render() is
// thread-safe.
#pragma once

#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "base/status.h"
#include "chat/jinja/template.h"

namespace se {

struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  // Special tokens the template sees as bos_token / eos_token; unset ones are undefined there.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // Tool schemas (a JSON list) or null; the template always sees `tools` (None when null).
  nlohmann::ordered_json tools = nullptr;
  // More template variables, e.g. {"enable_thinking": false}; they override the ones above.
  nlohmann::ordered_json extra_variables = nlohmann::ordered_json::object();
  // The local time strftime_now() reports (tests pin it); nullopt uses the current local time.
  std::optional<std::tm> now;
  jinja::RenderLimits limits;
};

class ChatTemplate {
 public:
  // Errors: kInvalidArgument "line L, column C: ..." for syntax errors.
  static Result<ChatTemplate> parse(std::string source);

  // `messages` is a JSON list of message objects ({"role", "content", ...}). Like transformers,
  // a message's `reasoning_content` / `thinking` / `reasoning` is visible under both
  // `reasoning_content` and `thinking`. Errors: kInvalidArgument with exactly the template's
  // raise_exception() message, or "line N: ..." for other template errors; kResourceExhausted when
  // a render limit is hit.
  Result<std::string> render(const nlohmann::ordered_json& messages,
                             const ChatTemplateOptions& options) const;
  // Same, for documents parsed without key order (objects iterate sorted by key).
  Result<std::string> render(const nlohmann::json& messages,
                             const ChatTemplateOptions& options) const;

  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::string source, jinja::Template tmpl)
      : source_(std::move(source)), template_(std::move(tmpl)) {}
  std::string source_;
  jinja::Template template_;
};

}  // namespace se
