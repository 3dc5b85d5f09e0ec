#include "chat/jinja/str_format.h"

#include <cmath>
#include <cstdio>

#include "chat/jinja/interpreter.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/py_str_ops.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

struct FormatSpec {
  char32_t fill = ' ';
  char align = 0;  // < > = ^ or 0 for the type's default
  char sign = '-';
  bool alternate = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

Result<FormatSpec> parse_spec(const std::string& text) {
  FormatSpec spec;
  std::u32string s = utf8_decode(text);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '=' || c == '^'; };
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.align = static_cast<char>(s[1]);
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = static_cast<char>(s[0]);
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' '))
    spec.sign = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '#') {
    spec.alternate = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    if (spec.align == 0) {
      spec.fill = '0';
      spec.align = '=';
    }
    ++i;
  }
  auto read_int = [&](int64_t* out) {
    if (i >= s.size() || s[i] < '0' || s[i] > '9') return;
    int64_t v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9')
      v = std::min<int64_t>(v * 10 + (s[i++] - '0'), 1 << 20);
    *out = v;
  };
  read_int(&spec.width);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = static_cast<char>(s[i++]);
  if (i < s.size() && s[i] == '.') {
    ++i;
    spec.precision = 0;
    if (i >= s.size() || s[i] < '0' || s[i] > '9') {
      return invalid_argument("ValueError: Format specifier missing precision");
    }
    read_int(&spec.precision);
  }
  if (i < s.size()) spec.type = static_cast<char>(s[i++]);
  if (i < s.size()) return invalid_argument("ValueError: Invalid format specifier");
  return spec;
}

std::string group_digits(const std::string& digits, char sep, size_t every) {
  std::string out;
  size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % every == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

// Pads `sign + body` to the width; '=' puts the fill between sign and digits.
std::string align_number(const std::string& sign, const std::string& body, const FormatSpec& spec) {
  const int64_t len = static_cast<int64_t>(utf8_length(sign) + utf8_length(body));
  if (spec.width <= len) return sign + body;
  std::string fill;
  for (int64_t i = 0; i < spec.width - len; ++i) append_utf8(fill, spec.fill);
  switch (spec.align == 0 ? '>' : spec.align) {
    case '<':
      return sign + body + fill;
    case '^': {
      std::string both = sign + body;
      return py_center(both, spec.width, spec.fill);
    }
    case '=':
      return sign + fill + body;
    default:
      return fill + sign + body;
  }
}

Result<std::string> format_int(int64_t v, const FormatSpec& spec) {
  char type = spec.type == 0 ? 'd' : spec.type;
  uint64_t magnitude = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits, prefix;
  switch (type) {
    case 'd':
    case 'n':
      digits = std::to_string(magnitude);
      break;
    case 'b':
      digits = fmt::format("{:b}", magnitude);
      prefix = "0b";
      break;
    case 'o':
      digits = fmt::format("{:o}", magnitude);
      prefix = "0o";
      break;
    case 'x':
      digits = fmt::format("{:x}", magnitude);
      prefix = "0x";
      break;
    case 'X':
      digits = fmt::format("{:X}", magnitude);
      prefix = "0X";
      break;
    case 'c': {
      std::string c;
      append_utf8(c, static_cast<char32_t>(magnitude));
      return align_number("", c, spec);
    }
    default:
      return invalid_argument("ValueError: Unknown format code '{}' for object of type 'int'",
                              type);
  }
  if (spec.grouping != 0)
    digits = group_digits(digits, spec.grouping, type == 'd' || type == 'n' ? 3 : 4);
  std::string sign = v < 0 ? "-" : spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "";
  if (spec.alternate) sign += prefix;
  return align_number(sign, digits, spec);
}

Result<std::string> format_float(double v, const FormatSpec& spec) {
  char type = spec.type;
  std::string body;
  double magnitude = std::fabs(v);
  if (type == 0 && spec.precision < 0) {
    body = py_float_repr(magnitude);
  } else {
    char c_type = type == 0 ? 'g' : type == '%' ? 'f' : type == 'n' ? 'g' : type;
    if (std::string("eEfFgG").find(c_type) == std::string::npos) {
      return invalid_argument("ValueError: Unknown format code '{}' for object of type 'float'",
                              type);
    }
    double x = type == '%' ? magnitude * 100 : magnitude;
    int precision = static_cast<int>(spec.precision >= 0 ? spec.precision : 6);
    std::string c_spec =
        std::string("%") + (spec.alternate ? "#" : "") + "." + std::to_string(precision) + c_type;
    int n = std::snprintf(nullptr, 0, c_spec.c_str(), x);
    body.resize(static_cast<size_t>(n));
    std::snprintf(body.data(), body.size() + 1, c_spec.c_str(), x);
    if (type == 0 && body.find_first_of(".einn") == std::string::npos) body += ".0";
    if (type == '%') body += "%";
  }
  if (spec.grouping != 0 && std::isfinite(v)) {
    size_t int_end = body.find_first_not_of("0123456789");
    if (int_end == std::string::npos) int_end = body.size();
    body = group_digits(body.substr(0, int_end), spec.grouping, 3) + body.substr(int_end);
  }
  std::string sign = std::signbit(v) && !std::isnan(v) ? "-"
                     : spec.sign == '+'                ? "+"
                     : spec.sign == ' '                ? " "
                                                       : "";
  return align_number(sign, body, spec);
}

}  // namespace

Result<std::string> format_spec_value(const Value& value, const std::string& spec_text) {
  if (spec_text.empty()) return py_str(value);
  SE_ASSIGN_OR_RETURN(FormatSpec spec, parse_spec(spec_text));
  if (value.is_string()) {
    if (spec.type != 0 && spec.type != 's') {
      return invalid_argument("ValueError: Unknown format code '{}' for object of type 'str'",
                              spec.type);
    }
    if (spec.sign != '-')
      return invalid_argument("ValueError: Sign not allowed in string format specifier");
    if (spec.align == '=') {
      return invalid_argument("ValueError: '=' alignment not allowed in string format specifier");
    }
    std::string s = value.as_string();
    if (spec.precision >= 0) s = s.substr(0, utf8_offset(s, static_cast<size_t>(spec.precision)));
    FormatSpec text = spec;
    if (text.align == 0) text.align = '<';
    return align_number("", s, text);
  }
  if (value.is_integral()) {
    if (spec.type != 0 && std::string("eEfFgG%").find(spec.type) != std::string::npos) {
      return format_float(static_cast<double>(value.as_int()), spec);
    }
    return format_int(value.as_int(), spec);
  }
  if (value.kind() == ValueKind::kFloat) return format_float(value.as_float(), spec);
  return type_error(
      fmt::format("unsupported format string passed to {}.__format__", py_type_name(value)));
}

Result<std::string> str_format(Interpreter& interp, const std::string& format,
                               const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  size_t i = 0;
  while (i < format.size()) {
    char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      return invalid_argument("ValueError: Single '}}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    size_t j = i + 1;
    int depth = 1;
    while (j < format.size() && depth > 0) {
      if (format[j] == '{') ++depth;
      if (format[j] == '}') --depth;
      if (depth > 0) ++j;
    }
    if (depth > 0) return invalid_argument("ValueError: expected '}}' before end of string");
    std::string field = format.substr(i + 1, j - i - 1);
    i = j + 1;
    // field_name, then optional !conversion and :spec (brackets protect their contents).
    size_t name_end = 0;
    bool in_bracket = false;
    while (name_end < field.size()) {
      char f = field[name_end];
      if (f == '[') in_bracket = true;
      if (f == ']') in_bracket = false;
      if (!in_bracket && (f == '!' || f == ':')) break;
      ++name_end;
    }
    std::string name = field.substr(0, name_end);
    char conversion = 0;
    std::string spec;
    size_t rest = name_end;
    if (rest < field.size() && field[rest] == '!') {
      if (rest + 1 >= field.size())
        return invalid_argument("ValueError: end of string while looking for conversion specifier");
      conversion = field[rest + 1];
      rest += 2;
    }
    if (rest < field.size() && field[rest] == ':') spec = field.substr(rest + 1);
    if (spec.find('{') != std::string::npos) {
      SE_ASSIGN_OR_RETURN(spec, str_format(interp, spec, args));
    }
    size_t k = 0;
    while (k < name.size() && name[k] != '.' && name[k] != '[') ++k;
    std::string arg_name = name.substr(0, k);
    Value value;
    if (arg_name.empty()) {
      if (used_manual) {
        return invalid_argument(
            "ValueError: cannot switch from manual field specification to automatic field "
            "numbering");
      }
      used_auto = true;
      if (auto_index >= args.positional.size()) {
        return invalid_argument(
            "IndexError: Replacement index {} out of range for positional args tuple", auto_index);
      }
      value = args.positional[auto_index++];
    } else if (std::all_of(arg_name.begin(), arg_name.end(),
                           [](char d) { return d >= '0' && d <= '9'; })) {
      if (used_auto) {
        return invalid_argument(
            "ValueError: cannot switch from automatic field numbering to manual field "
            "specification");
      }
      used_manual = true;
      size_t index = std::stoul(arg_name.substr(0, 9));
      if (index >= args.positional.size()) {
        return invalid_argument(
            "IndexError: Replacement index {} out of range for positional args tuple", index);
      }
      value = args.positional[index];
    } else {
      auto it = std::find_if(args.keyword.begin(), args.keyword.end(),
                             [&](const auto& kw) { return kw.first == arg_name; });
      if (it == args.keyword.end())
        return invalid_argument("KeyError: {}", py_repr_string(arg_name));
      value = it->second;
    }
    while (k < name.size()) {
      if (name[k] == '.') {
        size_t e = k + 1;
        while (e < name.size() && name[e] != '.' && name[e] != '[') ++e;
        SE_ASSIGN_OR_RETURN(value, interp.get_attr(value, name.substr(k + 1, e - k - 1)));
        k = e;
      } else {
        size_t e = name.find(']', k);
        if (e == std::string::npos)
          return invalid_argument("ValueError: Missing ']' in format string");
        std::string key = name.substr(k + 1, e - k - 1);
        bool numeric =
            !key.empty() && key.size() < 18 &&
            std::all_of(key.begin(), key.end(), [](char d) { return d >= '0' && d <= '9'; });
        SE_ASSIGN_OR_RETURN(value, interp.get_item(value, numeric ? Value::integer(std::stoll(key))
                                                                  : Value::string(key)));
        k = e + 1;
      }
    }
    if (conversion == 'r' || conversion == 'a') {
      value = Value::string(py_repr(value));
    } else if (conversion == 's') {
      value = Value::string(py_str(value));
    } else if (conversion != 0) {
      return invalid_argument("ValueError: Unknown conversion specifier {}", conversion);
    }
    SE_ASSIGN_OR_RETURN(std::string piece, format_spec_value(value, spec));
    out += piece;
    SE_RETURN_IF_ERROR(interp.check_string_size(out.size()));
  }
  return out;
}

}  // namespace se::jinja
