// Test helper: the typed ModelConfig of a normalized HF config that the test built valid.
#pragma once

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace se::testing {

inline ModelConfig typed(const nlohmann::json& normalized) { return *parse_model_config(normalized); }

}  // namespace se::testing
