// vanilla: dense serving. Every token stays resident, attention reads all of it, and the radix prefix cache
// shares prompt prefixes across requests. The baseline every sparse method is measured against.
#pragma once

#include "sparse/method_config.h"
#include "sparse/method_runtime.h"

namespace se {

class VanillaMethod final : public MethodRuntime {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

 private:
  explicit VanillaMethod(nlohmann::ordered_json config) : MethodRuntime("vanilla", std::move(config)) {
    traits_.static_decode_forward = true;  // the forward is the dense one, the same work every step
    traits_.position_only = true;          // it chooses nothing
    traits_.tensor_parallel = true;
  }
};

}  // namespace se
