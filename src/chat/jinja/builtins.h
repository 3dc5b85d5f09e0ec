// The built-in filters, tests, global functions and value methods of the interpreter, each written
// to behave like its jinja2 / Python counterpart under transformers' sandboxed environment. Lookup
// tables are immutable; the functions run on the render's Interpreter (one thread).
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "chat/jinja/value.h"

namespace se::jinja {

class Interpreter;

using FilterFn = Result<Value> (*)(Interpreter& interp, const Value& input, CallArgs& args);
using TestFn = Result<bool> (*)(Interpreter& interp, const Value& input, CallArgs& args);

// nullptr when the name is not implemented.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);
// Filter names jinja2 defines but this interpreter does not implement (errors say "not supported").
// Every jinja2 test is implemented.
bool is_unsupported_jinja_filter(std::string_view name);

// The global functions every template sees (range, dict, namespace, raise_exception,
// strftime_now - which reads the render's clock, Interpreter::now() - joiner, ...), or an
// undefined Value when `name` is not one.
Value find_global(std::string_view name);

// `object.name` for built-in types: a bound method of str/dict/list, or undefined. Covers exactly
// the attribute lookups jinja2 resolves through Python getattr before falling back to subscription.
// `found` tells whether the attribute exists (a method name of the type).
Value find_method(const Value& object, const std::string& name, bool* found);

}  // namespace se::jinja
