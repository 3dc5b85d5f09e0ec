// Python's str.format() as jinja2's sandbox allows it: positional, numbered and named fields,
// .attr and [key] lookups (through the sandboxed getattr/getitem), !r/!s/!a conversions and the
// format-spec mini-language for strings, ints and floats. Runs on the render's Interpreter.
#pragma once

#include <string>

#include "base/status.h"
#include "chat/jinja/value.h"

namespace se::jinja {

class Interpreter;

Result<std::string> str_format(Interpreter& interp, const std::string& format,
                               const CallArgs& args);

// format(value, spec), e.g. format_spec_value(3.14159, ".2f") == "3.14".
Result<std::string> format_spec_value(const Value& value, const std::string& spec);

}  // namespace se::jinja
