// ModelBundle: everything needed to serve one model: the Model, its Tokenizer and its chat template, loaded
// from one --model path. Immutable after load; the tokenizer and template may be shared across threads.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "chat/chat_template.h"
#include "model/model_loader.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace se {

// What a chat request adds to its messages when the template renders: tool schemas (a list, or null) and its
// chat_template_kwargs (e.g. enable_thinking).
struct ChatExtras {
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
};

struct ModelBundle {
  std::string name;        // served model name (--served-model-name, else the file or directory name)
  std::string path;
  std::string source_format;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;         // absent when the directory has no tokenizer.json (token ids only)
  std::optional<ChatTemplate> chat_template;  // absent when the model ships none

  // Loads weights (placed on `device`), tokenizer (GGUF vocabulary or tokenizer.json) and chat template. Errors
  // name the file.
  static Result<ModelBundle> load(const std::string& path, const LoadOptions& options, Device device = Device::kCpu);

  // The prompt of a chat: the template rendered with the generation prompt on (or off: a conversation so far).
  Result<std::string> render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt = true,
                                  const ChatExtras& extras = {}) const;
  // Whether the chat template renders tool schemas at all (it reads a `tools` variable).
  bool chat_template_supports_tools() const;
};

// The tokenizer of a loaded model: the GGUF vocabulary, or tokenizer.json (+ tokenizer_config.json) of its
// directory; none when the directory has no tokenizer.json.
Result<std::optional<Tokenizer>> load_tokenizer(const LoadedModel& loaded);

}  // namespace se
