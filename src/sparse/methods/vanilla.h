// vanilla: dense serving. Every token stays resident, attention reads all of it, and the radix prefix cache
// shares prompt prefixes across requests. The baseline every sparse method is measured against.
#pragma once

#include "sparse/method_config.h"
#include "sparse/method_runtime.h"

namespace se {

class VanillaMethod final : public MethodRuntime {
 public:
  static Result<std::unique_ptr<MethodRuntime>> create(const nlohmann::json& config);

  std::string_view name() const override { return "vanilla"; }
  const MethodTraits& traits() const override { return traits_; }
  const nlohmann::ordered_json& config() const override { return config_; }

 private:
  explicit VanillaMethod(nlohmann::ordered_json config) : config_(std::move(config)) {
    traits_.static_decode_forward = true;  // the forward is the dense one, the same work every step
  }

  MethodTraits traits_;  // otherwise the defaults: dense, full history, radix, no ops beyond the dense forward
  nlohmann::ordered_json config_;
};

}  // namespace se
