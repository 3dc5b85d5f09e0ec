#include "chat/jinja/py_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "chat/jinja/loop_state.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

void append_hex_escape(std::string& out, char prefix, uint32_t cp, int width) {
  out += fmt::format("\\{}{:0{}x}", prefix, cp, width);
}

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t cp : utf8_decode(s)) {
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
          if (cp > 0xFFFF) {
            uint32_t v = static_cast<uint32_t>(cp) - 0x10000;
            append_hex_escape(out, 'u', 0xD800 | (v >> 10), 4);
            append_hex_escape(out, 'u', 0xDC00 | (v & 0x3FF), 4);
          } else {
            append_hex_escape(out, 'u', static_cast<uint32_t>(cp), 4);
          }
        } else {
          append_utf8(out, cp);
        }
    }
  }
  out.push_back('"');
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(f);
}

Result<std::string> json_key(const Value& key) {
  switch (key.kind()) {
    case ValueKind::kString:
      return key.as_string();
    case ValueKind::kBool:
      return std::string(key.as_bool() ? "true" : "false");
    case ValueKind::kInt:
      return std::to_string(key.as_int());
    case ValueKind::kFloat:
      return json_float(key.as_float());
    case ValueKind::kNone:
      return std::string("null");
    default:
      return invalid_argument("TypeError: keys must be str, int, float, bool or None, not {}",
                              py_type_name(key));
  }
}

// Python's `<` for sort_keys: only like-typed keys compare.
Result<bool> json_key_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_float() < b.as_float();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  return invalid_argument("TypeError: '<' not supported between instances of '{}' and '{}'",
                          py_type_name(a), py_type_name(b));
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& options) : options_(options) {}

  Status write(const Value& v, int level) {
    switch (v.kind()) {
      case ValueKind::kNone:
        out_ += "null";
        return Status::ok();
      case ValueKind::kBool:
        out_ += v.as_bool() ? "true" : "false";
        return Status::ok();
      case ValueKind::kInt:
        out_ += std::to_string(v.as_int());
        return Status::ok();
      case ValueKind::kFloat:
        out_ += json_float(v.as_float());
        return Status::ok();
      case ValueKind::kString:
        append_json_string(out_, v.as_string(), options_.ensure_ascii);
        return Status::ok();
      case ValueKind::kList:
      case ValueKind::kTuple: {
        const auto& items = v.items();
        if (items.empty()) {
          out_ += "[]";
          return Status::ok();
        }
        out_.push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          separator(i == 0, level + 1);
          SE_RETURN_IF_ERROR(write(items[i], level + 1));
        }
        close(level, ']');
        return Status::ok();
      }
      case ValueKind::kDict:
        return write_dict(v.as_dict(), level);
      default:
        return invalid_argument("TypeError: Object of type {} is not JSON serializable",
                                py_type_name(v));
    }
  }

  std::string take() { return std::move(out_); }

 private:
  Status write_dict(const Dict& dict, int level) {
    if (dict.empty()) {
      out_ += "{}";
      return Status::ok();
    }
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& item : dict.items()) items.push_back(&item);
    if (options_.sort_keys) {
      Status failure;
      std::stable_sort(items.begin(), items.end(), [&](const auto* a, const auto* b) {
        if (!failure.is_ok()) return false;
        Result<bool> less = json_key_less(a->first, b->first);
        if (!less.is_ok()) {
          failure = less.status();
          return false;
        }
        return *less;
      });
      SE_RETURN_IF_ERROR(failure);
    }
    out_.push_back('{');
    for (size_t i = 0; i < items.size(); ++i) {
      separator(i == 0, level + 1);
      SE_ASSIGN_OR_RETURN(std::string key, json_key(items[i]->first));
      append_json_string(out_, key, options_.ensure_ascii);
      out_ += options_.key_separator;
      SE_RETURN_IF_ERROR(write(items[i]->second, level + 1));
    }
    close(level, '}');
    return Status::ok();
  }

  void separator(bool first, int level) {
    if (!first) out_ += options_.item_separator;
    if (options_.indent) newline(level);
  }

  void close(int level, char bracket) {
    if (options_.indent) newline(level);
    out_.push_back(bracket);
  }

  void newline(int level) {
    out_.push_back('\n');
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  const JsonOptions& options_;
  std::string out_;
};

}  // namespace

std::string py_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), std::fabs(f), std::chars_format::scientific);
  std::string sci(buf, result.ptr);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int decpt = std::stoi(sci.substr(e + 1)) + 1;  // digits before the decimal point
  std::string out = std::signbit(f) ? "-" : "";
  int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    int exp = decpt - 1;
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  } else if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(decpt - n, '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

std::string py_repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : utf8_decode(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp >= 0x20 && (cp < 0x7F || py_isprintable(cp))) {
      append_utf8(out, cp);
    } else if (cp <= 0xFF) {  // control characters, DEL and non-printable Latin-1
      append_hex_escape(out, 'x', static_cast<uint32_t>(cp), 2);
    } else if (cp <= 0xFFFF) {
      append_hex_escape(out, 'u', static_cast<uint32_t>(cp), 4);
    } else {
      append_hex_escape(out, 'U', static_cast<uint32_t>(cp), 8);
    }
  }
  out.push_back(quote);
  return out;
}

std::string py_repr(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return "Undefined";
    case ValueKind::kString:
      return v.is_markup() ? "Markup(" + py_repr_string(v.as_string()) + ")"
                           : py_repr_string(v.as_string());
    case ValueKind::kList:
    case ValueKind::kTuple: {
      bool tuple = v.kind() == ValueKind::kTuple;
      std::string out(1, tuple ? '(' : '[');
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        out += py_repr(items[i]);
      }
      if (tuple && items.size() == 1) out.push_back(',');
      out.push_back(tuple ? ')' : ']');
      return out;
    }
    case ValueKind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.as_dict().items()) {
        if (!first) out += ", ";
        first = false;
        out += py_repr(key) + ": " + py_repr(value);
      }
      return out + "}";
    }
    case ValueKind::kNamespace: {
      Value attrs = Value::dict(v.as_namespace().attrs);
      return "<Namespace " + py_repr(attrs) + ">";
    }
    case ValueKind::kIterator:
      if (v.as_iterator().type_name == "generator") {
        return fmt::format("<generator object {} at {}>", v.as_iterator().origin, v.identity());
      }
      return fmt::format("<{} object at {}>", v.as_iterator().type_name, v.identity());
    case ValueKind::kDictView:
      return py_type_name(v) + "(" + py_repr(Value::list(v.items())) + ")";
    case ValueKind::kRange: {
      auto [start, stop, step] = v.range_bounds();
      if (step == 1) return fmt::format("range({}, {})", start, stop);
      return fmt::format("range({}, {}, {})", start, stop, step);
    }
    case ValueKind::kCallable:
      return v.as_callable()->repr();
    case ValueKind::kLoop: {
      const LoopState& loop = v.as_loop();
      return fmt::format("<LoopContext {}/{}>", loop.index0 + 1, loop.items.size());
    }
    default:
      return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return "";
    case ValueKind::kNone:
      return "None";
    case ValueKind::kBool:
      return v.as_bool() ? "True" : "False";
    case ValueKind::kInt:
      return std::to_string(v.as_int());
    case ValueKind::kFloat:
      return py_float_repr(v.as_float());
    case ValueKind::kString:
      return v.as_string();
    default:
      return py_repr(v);
  }
}

std::string html_escape(const Value& v) {
  std::string s = py_str(v);
  if (v.is_markup()) return s;
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string py_type_name(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return "Undefined";
    case ValueKind::kNone:
      return "NoneType";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kString:
      return v.is_markup() ? "Markup" : "str";
    case ValueKind::kList:
      return "list";
    case ValueKind::kTuple:
      return "tuple";
    case ValueKind::kRange:
      return "range";
    case ValueKind::kDictView:
      return v.dict_view_kind() == Value::View::kKeys     ? "dict_keys"
             : v.dict_view_kind() == Value::View::kValues ? "dict_values"
                                                          : "dict_items";
    case ValueKind::kDict:
      return "dict";
    case ValueKind::kNamespace:
      return "TemplateNamespace";
    case ValueKind::kIterator:
      return v.as_iterator().type_name;
    case ValueKind::kCallable:
      return "function";
    case ValueKind::kLoop:
      return "LoopContext";
  }
  return "object";
}

std::string py_object_type_repr(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kNone:
      return "None";
    case ValueKind::kNamespace:
      return "transformers.utils.chat_template_utils.TemplateNamespace object";
    case ValueKind::kLoop:
      return "jinja2.runtime.LoopContext object";
    case ValueKind::kString:
      if (v.is_markup()) return "markupsafe.Markup object";
      return "str object";
    default:
      return py_type_name(v) + " object";
  }
}

Result<std::string> py_json_dumps(const Value& v, const JsonOptions& options) {
  JsonWriter writer(options);
  SE_RETURN_IF_ERROR(writer.write(v, 0));
  return writer.take();
}

}  // namespace se::jinja
