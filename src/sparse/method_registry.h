// The method registry: the one place that maps method names to their runtimes. Everything else creates
// methods through create_method() and learns about them through traits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparse/method_environment.h"
#include "sparse/method_runtime.h"

namespace se {

// How a method composes with another through the decode-time method's --sparse-config
// {"prompt_method": NAME, "prompt_config": {...}}: the prompt-time method compresses the prompt at the end of
// prefill, the decode-time method what the sequence generates afterwards.
enum class Composition : uint8_t {
  kNone,        // runs alone
  kPromptTime,  // can be the prompt_method of a decode-time method
  kDecodeTime,  // takes a prompt_method
};

struct MethodInfo {
  std::string name;
  std::string summary;  // one line: what the method does
  Composition composition = Composition::kNone;
  // Its `budget` counts the tokens kept of each `window` of tokens, not of the sequence (`sparse-engine eval` scales
  // it by the window).
  bool budget_per_window = false;
};

std::string_view composition_name(Composition composition);

// Every registered method, in a stable order (dense first, then selection, then eviction).
const std::vector<MethodInfo>& registered_methods();

// The method `name` with hyperparameters `config` (a JSON object or null); a clear error names an unknown
// method (listing the known ones), an unknown key or an out-of-range value. A decode-time method's config may name
// a prompt-time method (see Composition); any other pairing is an error that lists the valid ones. `environment` tells
// methods that need it about the model (the engine passes its tokenizer; empty elsewhere).
Result<std::unique_ptr<MethodRuntime>> create_method(const std::string& name, const nlohmann::json& config,
                                                     const MethodEnvironment& environment = {});

}  // namespace se
