// Binding of call arguments to a built-in's Python-style signature (positional, then keyword,
// then defaults), with Python's TypeError messages. Internal to the builtins.
#pragma once

#include <initializer_list>
#include <optional>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "chat/jinja/value.h"

namespace se::jinja {

struct Param {
  std::string_view name;
  std::optional<Value> default_value;  // nullopt: required
};

// Returns one Value per parameter. Fails on too many positional arguments, unknown or repeated
// keywords, and missing required parameters.
Result<std::vector<Value>> bind_args(std::string_view function, const CallArgs& args,
                                     std::initializer_list<Param> params);

}  // namespace se::jinja
