// Python's printf-style string formatting (`"%s, %d" % (a, b)` and the |format filter), following
// CPython's PyUnicode_Format: tuple arguments, a single argument, or %(key)s lookups in a mapping.
#include <cmath>
#include <cstdio>

#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

struct Spec {
  bool left = false, plus = false, space = false, alt = false, zero = false;
  int width = -1;
  int precision = -1;
};

std::string pad(std::string body, const Spec& spec, size_t prefix_len) {
  size_t len = utf8_length(body);
  if (spec.width < 0 || len >= static_cast<size_t>(spec.width)) return body;
  size_t fill = static_cast<size_t>(spec.width) - len;
  if (spec.left) return body + std::string(fill, ' ');
  if (spec.zero)
    return body.substr(0, prefix_len) + std::string(fill, '0') + body.substr(prefix_len);
  return std::string(fill, ' ') + body;
}

Result<std::string> format_integer(const Value& arg, char conv, const Spec& spec) {
  int64_t v;
  if (arg.is_integral()) {
    v = arg.as_int();
  } else if (arg.kind() == ValueKind::kFloat && (conv == 'd' || conv == 'i' || conv == 'u')) {
    double f = arg.as_float();
    if (!std::isfinite(f)) {
      return invalid_argument(
          "{}", std::isnan(f) ? "ValueError: cannot convert float NaN to integer"
                              : "OverflowError: cannot convert float infinity to integer");
    }
    v = static_cast<int64_t>(std::trunc(f));
  } else if (conv == 'd' || conv == 'i' || conv == 'u') {
    return type_error(
        fmt::format("%{} format: a real number is required, not {}", conv, py_type_name(arg)));
  } else {
    return type_error(
        fmt::format("%{} format: an integer is required, not {}", conv, py_type_name(arg)));
  }
  uint64_t magnitude = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits = conv == 'x'   ? fmt::format("{:x}", magnitude)
                       : conv == 'X' ? fmt::format("{:X}", magnitude)
                       : conv == 'o' ? fmt::format("{:o}", magnitude)
                                     : std::to_string(magnitude);
  if (spec.precision > static_cast<int>(digits.size())) {
    digits.insert(0, static_cast<size_t>(spec.precision) - digits.size(), '0');
  }
  std::string prefix = v < 0 ? "-" : spec.plus ? "+" : spec.space ? " " : "";
  if (spec.alt && (conv == 'x' || conv == 'X' || conv == 'o')) {
    prefix += conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X";
  }
  return pad(prefix + digits, spec, prefix.size());
}

Result<std::string> format_float(const Value& arg, char conv, const Spec& spec) {
  if (!arg.is_number()) {
    return type_error(fmt::format("must be real number, not {}", py_type_name(arg)));
  }
  std::string c_spec = "%";
  if (spec.left) c_spec += '-';
  if (spec.plus) c_spec += '+';
  if (spec.space) c_spec += ' ';
  if (spec.alt) c_spec += '#';
  if (spec.zero) c_spec += '0';
  if (spec.width >= 0) c_spec += std::to_string(spec.width);
  c_spec += "." + std::to_string(spec.precision >= 0 ? spec.precision : 6);
  c_spec += conv;
  double f = arg.as_float();
  int n = std::snprintf(nullptr, 0, c_spec.c_str(), f);
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, c_spec.c_str(), f);
  return out;
}

Result<std::string> format_one(const Value& arg, char conv, const Spec& spec) {
  switch (conv) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = conv == 's' ? py_str(arg) : py_repr(arg);
      if (spec.precision >= 0) s = s.substr(0, utf8_offset(s, static_cast<size_t>(spec.precision)));
      Spec text_spec = spec;
      text_spec.zero = false;
      return pad(std::move(s), text_spec, 0);
    }
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o':
      return format_integer(arg, conv, spec);
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G':
      return format_float(arg, conv, spec);
    case 'c': {
      std::string s;
      if (arg.is_integral() && arg.as_int() >= 0 && arg.as_int() <= 0x10FFFF) {
        append_utf8(s, static_cast<char32_t>(arg.as_int()));
      } else if (arg.is_string() && utf8_length(arg.as_string()) == 1) {
        s = arg.as_string();
      } else {
        return type_error("%c requires an int or a unicode character");
      }
      Spec text_spec = spec;
      text_spec.zero = false;
      return pad(std::move(s), text_spec, 0);
    }
    default:
      return invalid_argument("ValueError: unsupported format character '{}'", conv);
  }
}

}  // namespace

Result<std::string> percent_format(const std::string& format, const Value& args) {
  const bool is_tuple = args.kind() == ValueKind::kTuple;
  // CPython treats anything with __getitem__ (dict, list, range, jinja2's Undefined) as a mapping,
  // which also waives the "not all arguments converted" check.
  const bool mapping =
      !is_tuple && (args.kind() == ValueKind::kDict || args.kind() == ValueKind::kList ||
                    args.kind() == ValueKind::kRange || args.is_undefined());
  const std::vector<Value> single = {args};
  const std::vector<Value>& list = is_tuple ? args.items() : single;
  size_t next = 0;
  std::string out;
  size_t i = 0;
  auto next_arg = [&]() -> Result<Value> {
    if (next >= list.size()) return type_error("not enough arguments for format string");
    return list[next++];
  };
  while (i < format.size()) {
    char c = format[i++];
    if (c != '%') {
      out.push_back(c);
      continue;
    }
    if (i >= format.size()) return invalid_argument("ValueError: incomplete format");
    std::optional<Value> keyed;
    if (format[i] == '(') {
      int depth = 1;
      size_t start = ++i;
      while (i < format.size() && depth > 0) {
        if (format[i] == '(') ++depth;
        if (format[i] == ')') --depth;
        ++i;
      }
      if (depth > 0) return invalid_argument("ValueError: incomplete format key");
      if (args.kind() != ValueKind::kDict) return type_error("format requires a mapping");
      std::string key = format.substr(start, i - 1 - start);
      const Value* found = args.as_dict().find(std::string_view(key));
      if (found == nullptr) return invalid_argument("KeyError: {}", py_repr_string(key));
      keyed = *found;
    }
    Spec spec;
    for (; i < format.size(); ++i) {
      char f = format[i];
      if (f == '-')
        spec.left = true;
      else if (f == '+')
        spec.plus = true;
      else if (f == ' ')
        spec.space = true;
      else if (f == '#')
        spec.alt = true;
      else if (f == '0')
        spec.zero = true;
      else
        break;
    }
    auto read_number = [&](int* target) -> Status {
      if (i < format.size() && format[i] == '*') {
        ++i;
        SE_ASSIGN_OR_RETURN(Value w, next_arg());
        if (!w.is_integral()) return type_error("* wants int");
        *target = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(w.as_int(), 1 << 20)));
        return Status::ok();
      }
      if (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) {
        int n = 0;
        while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i]))) {
          n = std::min(n * 10 + (format[i++] - '0'), 1 << 20);
        }
        *target = n;
      }
      return Status::ok();
    };
    SE_RETURN_IF_ERROR(read_number(&spec.width));
    if (i < format.size() && format[i] == '.') {
      ++i;
      spec.precision = 0;
      SE_RETURN_IF_ERROR(read_number(&spec.precision));
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) return invalid_argument("ValueError: incomplete format");
    char conv = format[i++];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    Value arg;
    if (keyed) {
      arg = *keyed;
    } else {
      SE_ASSIGN_OR_RETURN(arg, next_arg());
    }
    SE_ASSIGN_OR_RETURN(std::string piece, format_one(arg, conv, spec));
    out += piece;
  }
  if (next < list.size() && !mapping) {
    return type_error("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace se::jinja
