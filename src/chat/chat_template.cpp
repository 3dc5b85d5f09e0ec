#include "chat/chat_template.h"

#include "chat/jinja/json_value.h"

namespace se {
namespace {

// transformers' _alias_reasoning_fields: the first non-null of reasoning_content / thinking /
// reasoning is exposed as {"thinking": r, **message, "reasoning_content": r}.
nlohmann::ordered_json alias_reasoning(const nlohmann::ordered_json& message) {
  static constexpr const char* kFields[] = {"reasoning_content", "thinking", "reasoning"};
  const nlohmann::ordered_json* reasoning = nullptr;
  for (const char* field : kFields) {
    auto it = message.find(field);
    if (it != message.end() && !it->is_null()) {
      reasoning = &*it;
      break;
    }
  }
  if (reasoning == nullptr) return message;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  out["thinking"] = *reasoning;
  for (auto it = message.begin(); it != message.end(); ++it) out[it.key()] = it.value();
  out["reasoning_content"] = *reasoning;
  return out;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string source) {
  SE_ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::parse(source));
  return ChatTemplate(std::move(source), std::move(tmpl));
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const ChatTemplateOptions& options) const {
  if (!messages.is_array()) return invalid_argument("chat messages must be a JSON list");
  nlohmann::ordered_json chat = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      return invalid_argument("chat message {} is not a JSON object", i);
    }
    chat.push_back(alias_reasoning(messages[i]));
  }
  if (!options.extra_variables.is_object()) {
    return invalid_argument("chat template extra_variables must be a JSON object");
  }
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  variables["messages"] = std::move(chat);
  variables["tools"] = options.tools;
  variables["documents"] = nullptr;
  variables["add_generation_prompt"] = options.add_generation_prompt;
  if (options.bos_token) variables["bos_token"] = *options.bos_token;
  if (options.eos_token) variables["eos_token"] = *options.eos_token;
  for (auto it = options.extra_variables.begin(); it != options.extra_variables.end(); ++it) {
    variables[it.key()] = it.value();
  }
  jinja::RenderOptions render_options;
  render_options.limits = options.limits;
  render_options.now = options.now;
  return template_.render(variables, render_options);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages,
                                         const ChatTemplateOptions& options) const {
  return render(nlohmann::ordered_json::parse(messages.dump()), options);
}

}  // namespace se
