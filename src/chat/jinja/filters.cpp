// String, number and conversion filters (jinja2/filters.py and transformers' tojson).
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "chat/jinja/builtin_args.h"
#include "chat/jinja/builtins_internal.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/py_str_ops.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

Result<Value> no_args(std::string_view name, const CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args(name, args, {}).status());
  return Value();
}

Result<Value> f_upper(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("upper", args).status());
  return Value::string(py_upper(py_str(in)), in.is_markup());
}

Result<Value> f_lower(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("lower", args).status());
  return Value::string(py_lower(py_str(in)), in.is_markup());
}

Result<Value> f_capitalize(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("capitalize", args).status());
  return Value::string(py_capitalize(py_str(in)), in.is_markup());
}

// jinja2's do_title: words start after runs of whitespace or any of - ( { [ <.
Result<Value> f_title(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("title", args).status());
  std::u32string cps = utf8_decode(py_str(in));
  auto is_sep = [](char32_t c) {
    return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    bool sep = is_sep(cps[i]);
    while (j < cps.size() && is_sep(cps[j]) == sep) ++j;
    std::u32string_view item = std::u32string_view(cps).substr(i, j - i);
    out += py_upper(utf8_encode(item.substr(0, 1)));
    out += py_lower(utf8_encode(item.substr(1)));
    i = j;
  }
  return Value::string(std::move(out), in.is_markup());
}

Result<Value> f_trim(Interpreter&, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("trim", args, {{"chars", Value::none()}}));
  if (a[0].is_none())
    return Value::string(py_strip(py_str(in), nullptr, StripSide::kBoth), in.is_markup());
  if (!a[0].is_string()) return type_error("strip arg must be None or str");
  return Value::string(py_strip(py_str(in), &a[0].as_string(), StripSide::kBoth), in.is_markup());
}

Result<Value> f_replace(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(
      auto a, bind_args("replace", args, {{"old", {}}, {"new", {}}, {"count", Value::none()}}));
  int64_t count = -1;
  if (!a[2].is_none()) {
    SE_ASSIGN_OR_RETURN(count, int_arg(a[2], "count"));
  }
  std::string s = py_str(in);
  std::string old = py_str(a[0]);
  std::string repl = py_str(a[1]);
  size_t hits = old.empty() ? utf8_length(s) + 1 : 0;
  for (size_t p = old.empty() ? std::string::npos : s.find(old); p != std::string::npos;
       p = s.find(old, p + old.size())) {
    ++hits;
  }
  SE_RETURN_IF_ERROR(interp.check_string_size(s.size() + hits * repl.size()));
  return Value::string(py_replace(s, old, repl, count));
}

Result<Value> f_center(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("center", args, {{"width", Value::integer(80)}}));
  SE_ASSIGN_OR_RETURN(int64_t width, int_arg(a[0], "width"));
  SE_RETURN_IF_ERROR(interp.check_string_size(static_cast<size_t>(std::max<int64_t>(0, width))));
  return Value::string(py_center(py_str(in), width, ' '), in.is_markup());
}

Result<Value> f_indent(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("indent", args,
                                        {{"width", Value::integer(4)},
                                         {"first", Value::boolean(false)},
                                         {"blank", Value::boolean(false)}}));
  std::string indention;
  if (a[0].is_string()) {
    indention = a[0].as_string();
  } else {
    SE_ASSIGN_OR_RETURN(int64_t width, int_arg(a[0], "width"));
    SE_RETURN_IF_ERROR(interp.check_string_size(static_cast<size_t>(std::max<int64_t>(0, width))));
    indention = std::string(static_cast<size_t>(std::max<int64_t>(0, width)), ' ');
  }
  // jinja2 appends "\n" to the value itself before splitting lines, so only strings work.
  if (in.is_undefined()) return undefined_error(in);
  if (in.kind() == ValueKind::kList) {
    return invalid_argument("AttributeError: 'list' object has no attribute 'splitlines'");
  }
  if (!in.is_string()) {
    return type_error(
        fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", py_type_name(in)));
  }
  std::vector<std::string> lines = py_splitlines(py_str(in) + "\n", false);
  SE_RETURN_IF_ERROR(
      interp.check_string_size(py_str(in).size() + lines.size() * (indention.size() + 1)));
  std::string rv;
  if (a[2].truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (a[1].truthy()) rv = indention + rv;
  return Value::string(std::move(rv), in.is_markup());
}

Result<Value> f_wordcount(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("wordcount", args).status());
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : utf8_decode(py_str(in))) {
    bool w = c == '_' || py_isalnum(c);
    if (w && !in_word) ++words;
    in_word = w;
  }
  return Value::integer(words);
}

Result<Value> f_string(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("string", args).status());
  if (in.is_string()) return in;
  return Value::string(py_str(in));
}

Result<Value> f_safe(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("safe", args).status());
  return Value::string(py_str(in), true);
}

Result<Value> f_escape(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("escape", args).status());
  return Value::string(html_escape(in), true);
}

Result<Value> f_forceescape(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("forceescape", args).status());
  return Value::string(html_escape(Value::string(py_str(in))), true);
}

Result<Value> f_format(Interpreter& interp, const Value& in, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    return invalid_argument(
        "FilterArgumentError: can't handle positional and keyword arguments at the same time");
  }
  Value format_args;
  if (!args.keyword.empty()) {
    Dict kwargs;
    for (auto& [k, v] : args.keyword) kwargs.set(Value::string(k), v);
    format_args = Value::dict(std::move(kwargs));
  } else {
    format_args = Value::tuple(args.positional);
  }
  SE_ASSIGN_OR_RETURN(std::string out, percent_format(py_str(in), format_args));
  SE_RETURN_IF_ERROR(interp.check_string_size(out.size()));
  return Value::string(std::move(out), in.is_markup());
}

// Python float(str): optional sign, digits with single underscores, fraction, exponent, inf, nan.
std::optional<double> parse_py_float(const std::string& text) {
  std::string s = py_strip(text, nullptr, StripSide::kBoth);
  std::string body = s;
  size_t i = 0;
  if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
  std::string rest = py_lower(body.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") {
    return std::strtod((body.substr(0, i) + rest).c_str(), nullptr);
  }
  std::string clean = body.substr(0, i);
  bool digits = false, prev_digit = false;
  bool seen_dot = false, seen_exp = false;
  for (; i < body.size(); ++i) {
    char c = body[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      prev_digit = true;
      clean.push_back(c);
    } else if (c == '_') {
      if (!prev_digit || i + 1 >= body.size() ||
          !std::isdigit(static_cast<unsigned char>(body[i + 1]))) {
        return std::nullopt;
      }
      prev_digit = false;
    } else if (c == '.' && !seen_dot && !seen_exp) {
      seen_dot = true;
      prev_digit = false;
      clean.push_back(c);
    } else if ((c == 'e' || c == 'E') && digits && !seen_exp) {
      seen_exp = true;
      prev_digit = false;
      digits = false;
      clean.push_back(c);
      if (i + 1 < body.size() && (body[i + 1] == '+' || body[i + 1] == '-'))
        clean.push_back(body[++i]);
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return std::strtod(clean.c_str(), nullptr);
}

// Python int(str, base) for bases 2..36 and 0 (prefix-detected), ASCII digits.
std::optional<int64_t> parse_py_int(const std::string& text, int64_t base, bool* overflow) {
  std::string s = py_strip(text, nullptr, StripSide::kBoth);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  auto has_prefix = [&](char p) {
    return i + 1 < s.size() && s[i] == '0' && (s[i + 1] | 0x20) == p;
  };
  if ((base == 0 || base == 16) && has_prefix('x')) {
    base = 16;
    i += 2;
  } else if ((base == 0 || base == 8) && has_prefix('o')) {
    base = 8;
    i += 2;
  } else if ((base == 0 || base == 2) && has_prefix('b')) {
    base = 2;
    i += 2;
  } else if (base == 0) {
    base = 10;
    // Base 0 rejects leading zeros on non-zero decimals.
    if (i + 1 < s.size() && s[i] == '0' && s.find_first_not_of("0_", i) != std::string::npos) {
      return std::nullopt;
    }
  }
  if (i < s.size() && s[i] == '_' && i >= 2 && (s[i - 1] | 0x20) >= 'a') ++i;  // "0x_1f"
  uint64_t value = 0;
  bool any = false, prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
      d = (c | 0x20) - 'a' + 10;
    else if (c == '_' && prev_digit && i + 1 < s.size()) {
      prev_digit = false;
      continue;
    } else
      return std::nullopt;
    if (d >= base) return std::nullopt;
    if (value > (UINT64_MAX - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base))
      *overflow = true;
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    any = prev_digit = true;
  }
  if (!any || !prev_digit) return std::nullopt;
  if (value > static_cast<uint64_t>(INT64_MAX) + (negative ? 1 : 0)) *overflow = true;
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

std::optional<int64_t> float_to_int(double f) {
  if (!std::isfinite(f) || f >= 9.2233720368547758e18 || f < -9.2233720368547758e18)
    return std::nullopt;
  return static_cast<int64_t>(std::trunc(f));
}

Result<Value> f_int(Interpreter&, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(
      auto a,
      bind_args("int", args, {{"default", Value::integer(0)}, {"base", Value::integer(10)}}));
  if (in.is_undefined()) return undefined_error(in);
  if (in.is_integral()) return Value::integer(in.as_int());
  if (in.kind() == ValueKind::kFloat) {
    if (auto i = float_to_int(in.as_float())) return Value::integer(*i);
    return a[0];
  }
  if (in.is_string()) {
    SE_ASSIGN_OR_RETURN(int64_t base, int_arg(a[1], "base"));
    bool overflow = false;
    std::optional<int64_t> v = parse_py_int(in.as_string(), base, &overflow);
    if (overflow) return invalid_argument("OverflowError: integer result exceeds 64 bits");
    if (v) return Value::integer(*v);
    // jinja2: "42.23"|int gives 42 through float().
    if (auto f = parse_py_float(in.as_string())) {
      if (auto i = float_to_int(*f)) return Value::integer(*i);
    }
  }
  return a[0];
}

Result<Value> f_float(Interpreter&, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("float", args, {{"default", Value::floating(0.0)}}));
  if (in.is_undefined()) return undefined_error(in);
  if (in.is_number()) return Value::floating(in.as_float());
  if (in.is_string()) {
    if (auto f = parse_py_float(in.as_string())) return Value::floating(*f);
  }
  return a[0];
}

// Python's round(x, n): correctly rounded, ties to even.
double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x) || ndigits > 323) return x;
  if (ndigits < -308) return 0.0 * x;
  if (ndigits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  double scale = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / scale) * scale;
}

Result<Value> f_round(Interpreter&, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(
      auto a, bind_args("round", args,
                        {{"precision", Value::integer(0)}, {"method", Value::string("common")}}));
  std::string method = a[1].is_string() ? a[1].as_string() : "";
  if (method != "common" && method != "ceil" && method != "floor") {
    return invalid_argument("FilterArgumentError: method must be common, ceil or floor");
  }
  if (in.is_undefined()) return undefined_error(in);
  if (!in.is_number()) {
    return type_error(fmt::format("type {} doesn't define __round__ method", py_type_name(in)));
  }
  SE_ASSIGN_OR_RETURN(int64_t precision, int_arg(a[0], "precision"));
  if (method == "common") {
    if (in.is_integral()) {
      if (precision >= 0) return Value::integer(in.as_int());
      return Value::integer(
          static_cast<int64_t>(py_round(static_cast<double>(in.as_int()), precision)));
    }
    return Value::floating(py_round(in.as_float(), precision));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double scaled = in.as_float() * scale;
  if (!std::isfinite(scaled)) {
    return invalid_argument("{}", std::isnan(scaled)
                                      ? "ValueError: cannot convert float NaN to integer"
                                      : "OverflowError: cannot convert float infinity to integer");
  }
  double r = method == "ceil" ? std::ceil(scaled) : std::floor(scaled);
  return Value::floating(r / scale);
}

Result<Value> f_abs(Interpreter&, const Value& in, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("abs", args).status());
  if (in.is_integral()) {
    if (in.as_int() == INT64_MIN)
      return invalid_argument("OverflowError: integer result exceeds 64 bits");
    return Value::integer(std::abs(in.as_int()));
  }
  if (in.kind() == ValueKind::kFloat) return Value::floating(std::fabs(in.as_float()));
  return type_error(fmt::format("bad operand type for abs(): '{}'", py_type_name(in)));
}

Result<Value> f_default(Interpreter&, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("default", args,
                                        {{"default_value", Value::string("")},
                                         {"boolean", Value::boolean(false)}}));
  if (in.is_undefined() || (a[1].truthy() && !in.truthy())) return a[0];
  return in;
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
Result<Value> f_tojson(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("tojson", args,
                                        {{"ensure_ascii", Value::boolean(false)},
                                         {"indent", Value::none()},
                                         {"separators", Value::none()},
                                         {"sort_keys", Value::boolean(false)}}));
  JsonOptions options;
  options.ensure_ascii = a[0].truthy();
  options.sort_keys = a[3].truthy();
  if (a[1].is_string()) {
    options.indent = a[1].as_string();
  } else if (a[1].is_integral()) {
    options.indent =
        std::string(static_cast<size_t>(std::clamp<int64_t>(a[1].as_int(), 0, 1 << 16)), ' ');
  } else if (!a[1].is_none()) {
    return type_error(
        fmt::format("can't multiply sequence by non-int of type '{}'", py_type_name(a[1])));
  }
  if (options.indent) options.item_separator.assign(1, ',');
  if (!a[2].is_none()) {
    if (!a[2].is_sequence() || a[2].items().size() != 2 || !a[2].items()[0].is_string() ||
        !a[2].items()[1].is_string()) {
      return invalid_argument("ValueError: separators must be a pair of strings");
    }
    options.item_separator = a[2].items()[0].as_string();
    options.key_separator = a[2].items()[1].as_string();
  }
  SE_ASSIGN_OR_RETURN(std::string json, py_json_dumps(in, options));
  SE_RETURN_IF_ERROR(interp.check_string_size(json.size()));
  return Value::string(std::move(json));
}

Result<Value> f_attr(Interpreter& interp, const Value& in, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("attr", args, {{"name", {}}}));
  if (!a[0].is_string()) return type_error("attribute name must be string");
  if (in.kind() == ValueKind::kDict) {
    // Only real attributes (methods) of a dict; keys are not attributes.
    bool found = false;
    Value method = find_method(in, a[0].as_string(), &found);
    if (found) return method;
    return Value::undefined(fmt::format("{} has no attribute {}",
                                        py_repr_string(py_object_type_repr(in)),
                                        py_repr_string(a[0].as_string())));
  }
  return interp.get_attr(in, a[0].as_string());
}

}  // namespace

Result<int64_t> int_arg(const Value& v, std::string_view what) {
  if (v.is_integral()) return v.as_int();
  return type_error(
      fmt::format("'{}' object cannot be interpreted as an integer ({})", py_type_name(v), what));
}

Result<std::optional<int64_t>> optional_int_arg(const Value& v, std::string_view what) {
  if (v.is_none()) return std::optional<int64_t>();
  SE_ASSIGN_OR_RETURN(int64_t i, int_arg(v, what));
  return std::optional<int64_t>(i);
}

Result<std::string> str_arg(const Value& v, std::string_view what) {
  if (v.is_string()) return v.as_string();
  return type_error(fmt::format("{} must be str, not {}", what, py_type_name(v)));
}

FilterFn find_string_filter(std::string_view name) {
  struct Entry {
    std::string_view name;
    FilterFn fn;
  };
  static constexpr Entry kFilters[] = {
      {"upper", f_upper},
      {"lower", f_lower},
      {"capitalize", f_capitalize},
      {"title", f_title},
      {"trim", f_trim},
      {"replace", f_replace},
      {"center", f_center},
      {"indent", f_indent},
      {"wordcount", f_wordcount},
      {"string", f_string},
      {"safe", f_safe},
      {"escape", f_escape},
      {"e", f_escape},
      {"forceescape", f_forceescape},
      {"format", f_format},
      {"int", f_int},
      {"float", f_float},
      {"round", f_round},
      {"abs", f_abs},
      {"default", f_default},
      {"d", f_default},
      {"tojson", f_tojson},
      {"attr", f_attr},
  };
  for (const Entry& e : kFilters) {
    if (e.name == name) return e.fn;
  }
  return nullptr;
}

FilterFn find_filter(std::string_view name) {
  if (FilterFn fn = find_string_filter(name)) return fn;
  return find_sequence_filter(name);
}

bool is_unsupported_jinja_filter(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "filesizeformat", "groupby",   "pprint", "random",   "slice",  "striptags",
      "truncate",       "urlencode", "urlize", "wordwrap", "xmlattr"};
  for (std::string_view n : kNames) {
    if (n == name) return true;
  }
  return false;
}

}  // namespace se::jinja
