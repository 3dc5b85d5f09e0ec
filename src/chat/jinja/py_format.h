// Python's text forms of values: str() (what {{ x }} prints), repr() (how containers print their
// items), float repr, and json.dumps as transformers' tojson filter calls it. Pure functions.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"
#include "chat/jinja/value.h"

namespace se::jinja {

// Python float.__repr__: shortest round-trip digits, scientific outside 1e-4 <= |x| < 1e16.
std::string py_float_repr(double f);
// Python str(x): strings as is, None -> "None", True -> "True", containers via repr of items.
std::string py_str(const Value& v);
// Python repr(x), e.g. 'it\'s' -> "it's" with Python's quote choice and escapes.
std::string py_repr(const Value& v);
std::string py_repr_string(const std::string& s);
// markupsafe.escape(): Markup strings pass through; anything else is str()'d with & < > " '
// escaped.
std::string html_escape(const Value& v);
// Python's type(x).__name__, for error messages.
std::string py_type_name(const Value& v);
// jinja2's object_type_repr, for undefined hints: "dict object", "None", ...
std::string py_object_type_repr(const Value& v);

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // json.dumps indent, already turned into its string form
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// Python's `format % args` (printf-style; conversions s r a d i u f F e E g G x X o c %).
Result<std::string> percent_format(const std::string& format, const Value& args);

// json.dumps(v, ...) with Python's formatting. Fails like Python on values JSON cannot represent
// (Undefined, generators, namespaces, functions) and on unsortable or unsupported keys.
Result<std::string> py_json_dumps(const Value& v, const JsonOptions& options);

}  // namespace se::jinja
