// Shared pieces of the built-in filters, tests and methods (internal to src/chat/jinja).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "chat/jinja/builtins.h"
#include "chat/jinja/value.h"

namespace se::jinja {

class Interpreter;

// A Python int from an int or bool argument, with a TypeError naming the parameter otherwise.
Result<int64_t> int_arg(const Value& v, std::string_view what);
// An optional int: None gives nullopt.
Result<std::optional<int64_t>> optional_int_arg(const Value& v, std::string_view what);
// A str argument (TypeError otherwise).
Result<std::string> str_arg(const Value& v, std::string_view what);

// jinja2's make_attrgetter: "a.b.0" looked up item-first at each step; `default_value`
// replaces an undefined result when given.
Result<Value> get_attribute_path(Interpreter& interp, const Value& item, const Value& attribute,
                                 const std::optional<Value>& default_value);
// jinja2's ignore_case: lower-cases strings, leaves other values.
Value ignore_case(const Value& v);
// Python's sorted() with a key function on precomputed keys: stable, `reverse` keeps ties in order.
Result<std::vector<Value>> sorted_by_keys(std::vector<Value> items, std::vector<Value> keys,
                                          bool reverse);

using MethodFn = Result<Value> (*)(Interpreter& interp, const Value& self, CallArgs& args);
struct MethodEntry {
  std::string_view name;
  MethodFn fn;  // nullptr: exists in Python but mutates, so the sandbox blocks it
};
// The str methods (str_methods.cpp); nullptr when `name` is not one.
const MethodEntry* find_str_method(std::string_view name);
// For Python methods that exist but are not implemented here: fails when called.
Result<Value> unsupported_method(Interpreter& interp, const Value& self, CallArgs& args);

// The filter tables, split by file.
FilterFn find_string_filter(std::string_view name);
FilterFn find_sequence_filter(std::string_view name);
FilterFn find_lazy_filter(std::string_view name);

}  // namespace se::jinja
