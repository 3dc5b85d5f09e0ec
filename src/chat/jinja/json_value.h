// Conversion of nlohmann JSON documents into interpreter Values (the Python objects json.loads
// would build): objects keep their key order with ordered_json, integers stay ints, floats stay
// floats. Strings must be valid UTF-8 and nesting is bounded. Pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "chat/jinja/value.h"

namespace se::jinja {

Result<Value> value_from_json(const nlohmann::ordered_json& json, int max_depth = 512);
Result<Value> value_from_json(const nlohmann::json& json, int max_depth = 512);

}  // namespace se::jinja
