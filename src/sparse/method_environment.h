// MethodEnvironment: what a method may learn about the model it serves beyond its config: for methods that
// feed the model prompts of their own (context reconstruction), the tokenizer and the chat template's reply
// suffix; for methods that derive their own weights from the model's (low-rank factors), the model. The engine builds
// it from the ModelBundle and hands it to create_method; every field is optional (drivers without a tokenizer, such as
// the fidelity tool or dummy weights, leave it empty) and a method that reads it documents what it does without it.
// Plain data; `encode` must stay callable while the method lives.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace se {

class Model;

struct MethodEnvironment {
  // Text -> token ids with the model's tokenizer: no BOS/EOS added; special-token text such as "<|im_end|>"
  // becomes the special token (HF tokenizer.encode(add_special_tokens=False)). Empty: no tokenizer.
  std::function<std::vector<int32_t>(std::string_view text)> encode;
  // What the chat template puts after a user message's content, up to where the assistant's reply starts,
  // e.g. "<|im_end|>\n<|im_start|>assistant\n". "\n" when the model has no chat template (kvpress's choice).
  std::string chat_suffix = "\n";
  // The model served, which outlives the method. Null: not known (a method that needs it refuses to start).
  const Model* model = nullptr;
};

}  // namespace se
