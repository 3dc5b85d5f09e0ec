// The method registry: the one place that maps method names to their runtimes. Everything else creates
// methods through create_method() and learns about them through traits.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sparse/method_environment.h"
#include "sparse/method_runtime.h"

namespace se {

struct MethodInfo {
  std::string name;
  std::string summary;  // one line: what the method does
};

// Every registered method, in a stable order (dense first, then selection, then eviction).
const std::vector<MethodInfo>& registered_methods();

// The method `name` with hyperparameters `config` (a JSON object or null); a clear error names an unknown
// method (listing the known ones), an unknown key or an out-of-range value. `environment` tells methods that
// need it about the model (the engine passes its tokenizer; empty elsewhere).
Result<std::unique_ptr<MethodRuntime>> create_method(const std::string& name, const nlohmann::json& config,
                                                     const MethodEnvironment& environment = {});

}  // namespace se
