// The str methods templates call (startswith, strip, split, replace, format, ...), with Python's
// semantics on code points.
#include <algorithm>

#include "chat/jinja/builtin_args.h"
#include "chat/jinja/builtins_internal.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/py_str_ops.h"
#include "chat/jinja/str_format.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

Result<Value> str_list(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value::string(std::move(p)));
  return Value::list(std::move(out));
}

// Reads (sub, start=None, end=None) and returns code-point bounds for find/count/startswith.
struct Window {
  std::u32string text;
  int64_t begin = 0;
  int64_t end = 0;
};

Result<Window> window_args(const Value& self, const Value& start, const Value& end) {
  Window w;
  w.text = utf8_decode(self.as_string());
  SE_ASSIGN_OR_RETURN(std::optional<int64_t> s, optional_int_arg(start, "start"));
  SE_ASSIGN_OR_RETURN(std::optional<int64_t> e, optional_int_arg(end, "end"));
  py_adjust_bounds(s, e, static_cast<int64_t>(w.text.size()), &w.begin, &w.end);
  return w;
}

Result<Value> affix_test(const Value& self, CallArgs& args, const char* name, bool suffix) {
  SE_ASSIGN_OR_RETURN(
      auto a,
      bind_args(name, args, {{"prefix", {}}, {"start", Value::none()}, {"end", Value::none()}}));
  SE_ASSIGN_OR_RETURN(Window w, window_args(self, a[1], a[2]));
  std::vector<Value> candidates;
  if (a[0].is_string()) {
    candidates.push_back(a[0]);
  } else if (a[0].kind() == ValueKind::kTuple) {
    candidates = a[0].items();
  }
  if (candidates.empty() && !a[0].is_string() && a[0].kind() != ValueKind::kTuple) {
    return type_error(fmt::format("{} first arg must be str or a tuple of str, not {}", name,
                                  py_type_name(a[0])));
  }
  for (const Value& c : candidates) {
    if (!c.is_string()) {
      return type_error(
          fmt::format("tuple for {} must only contain str, not {}", name, py_type_name(c)));
    }
    std::u32string affix = utf8_decode(c.as_string());
    const auto n = static_cast<int64_t>(affix.size());
    if (w.begin > static_cast<int64_t>(w.text.size()) || w.end - w.begin < n) continue;
    int64_t at = suffix ? w.end - n : w.begin;
    if (w.text.compare(static_cast<size_t>(at), static_cast<size_t>(n), affix) == 0) {
      return Value::boolean(true);
    }
  }
  return Value::boolean(false);
}

Result<Value> m_startswith(Interpreter&, const Value& s, CallArgs& a) {
  return affix_test(s, a, "startswith", false);
}
Result<Value> m_endswith(Interpreter&, const Value& s, CallArgs& a) {
  return affix_test(s, a, "endswith", true);
}

Result<Value> strip_method(const Value& self, CallArgs& args, const char* name, StripSide side) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"chars", Value::none()}}));
  if (a[0].is_none()) return Value::string(py_strip(self.as_string(), nullptr, side));
  if (!a[0].is_string()) return type_error(fmt::format("{} arg must be None or str", name));
  return Value::string(py_strip(self.as_string(), &a[0].as_string(), side));
}

Result<Value> m_strip(Interpreter&, const Value& s, CallArgs& a) {
  return strip_method(s, a, "strip", StripSide::kBoth);
}
Result<Value> m_lstrip(Interpreter&, const Value& s, CallArgs& a) {
  return strip_method(s, a, "lstrip", StripSide::kLeft);
}
Result<Value> m_rstrip(Interpreter&, const Value& s, CallArgs& a) {
  return strip_method(s, a, "rstrip", StripSide::kRight);
}

Result<Value> split_method(const Value& self, CallArgs& args, const char* name, bool from_right) {
  SE_ASSIGN_OR_RETURN(
      auto a, bind_args(name, args, {{"sep", Value::none()}, {"maxsplit", Value::integer(-1)}}));
  SE_ASSIGN_OR_RETURN(int64_t maxsplit, int_arg(a[1], "maxsplit"));
  const std::string* sep = nullptr;
  if (!a[0].is_none()) {
    if (!a[0].is_string()) {
      return type_error(fmt::format("must be str or None, not {}", py_type_name(a[0])));
    }
    if (a[0].as_string().empty()) return invalid_argument("ValueError: empty separator");
    sep = &a[0].as_string();
  }
  return str_list(from_right ? py_rsplit(self.as_string(), sep, maxsplit)
                             : py_split(self.as_string(), sep, maxsplit));
}

Result<Value> m_split(Interpreter&, const Value& s, CallArgs& a) {
  return split_method(s, a, "split", false);
}
Result<Value> m_rsplit(Interpreter&, const Value& s, CallArgs& a) {
  return split_method(s, a, "rsplit", true);
}

Result<Value> m_splitlines(Interpreter&, const Value& s, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("splitlines", args, {{"keepends", Value::boolean(false)}}));
  return str_list(py_splitlines(s.as_string(), a[0].truthy()));
}

template <std::string (*kFn)(std::string_view)>
Result<Value> case_method(Interpreter&, const Value& s, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("str method", args, {}).status());
  return Value::string(kFn(s.as_string()));
}

Result<Value> m_replace(Interpreter& interp, const Value& s, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("replace", args,
                                        {{"old", {}}, {"new", {}}, {"count", Value::integer(-1)}}));
  SE_ASSIGN_OR_RETURN(std::string old, str_arg(a[0], "replace() argument 1"));
  SE_ASSIGN_OR_RETURN(std::string repl, str_arg(a[1], "replace() argument 2"));
  SE_ASSIGN_OR_RETURN(int64_t count, int_arg(a[2], "count"));
  std::string out = py_replace(s.as_string(), old, repl, count);
  SE_RETURN_IF_ERROR(interp.check_string_size(out.size()));
  return Value::string(std::move(out));
}

Result<Value> find_method_impl(const Value& self, CallArgs& args, const char* name, bool reverse,
                               bool raise) {
  SE_ASSIGN_OR_RETURN(
      auto a,
      bind_args(name, args, {{"sub", {}}, {"start", Value::none()}, {"end", Value::none()}}));
  SE_ASSIGN_OR_RETURN(std::string sub, str_arg(a[0], "must be str"));
  SE_ASSIGN_OR_RETURN(Window w, window_args(self, a[1], a[2]));
  int64_t i = py_find(w.text, utf8_decode(sub), w.begin, w.end, reverse);
  if (i < 0 && raise) return invalid_argument("ValueError: substring not found");
  return Value::integer(i);
}

Result<Value> m_find(Interpreter&, const Value& s, CallArgs& a) {
  return find_method_impl(s, a, "find", false, false);
}
Result<Value> m_rfind(Interpreter&, const Value& s, CallArgs& a) {
  return find_method_impl(s, a, "rfind", true, false);
}
Result<Value> m_index(Interpreter&, const Value& s, CallArgs& a) {
  return find_method_impl(s, a, "index", false, true);
}
Result<Value> m_rindex(Interpreter&, const Value& s, CallArgs& a) {
  return find_method_impl(s, a, "rindex", true, true);
}

Result<Value> m_count(Interpreter&, const Value& s, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(
      auto a,
      bind_args("count", args, {{"sub", {}}, {"start", Value::none()}, {"end", Value::none()}}));
  SE_ASSIGN_OR_RETURN(std::string sub, str_arg(a[0], "must be str"));
  SE_ASSIGN_OR_RETURN(Window w, window_args(s, a[1], a[2]));
  return Value::integer(py_count(w.text, utf8_decode(sub), w.begin, w.end));
}

Result<Value> m_join(Interpreter& interp, const Value& s, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("join", args, {{"iterable", {}}}));
  SE_ASSIGN_OR_RETURN(std::vector<Value> items, interp.iterate(a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return type_error(fmt::format("sequence item {}: expected str instance, {} found", i,
                                    py_type_name(items[i])));
    }
    if (i > 0) out += s.as_string();
    out += items[i].as_string();
    SE_RETURN_IF_ERROR(interp.check_string_size(out.size()));
  }
  return Value::string(std::move(out));
}

template <bool (*kPred)(char32_t)>
Result<Value> all_chars(Interpreter&, const Value& s, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("str method", args, {}).status());
  std::u32string cps = utf8_decode(s.as_string());
  return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), kPred));
}

bool is_ascii(char32_t c) { return c < 0x80; }

Result<Value> m_isascii(Interpreter&, const Value& s, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("isascii", args, {}).status());
  std::u32string cps = utf8_decode(s.as_string());
  return Value::boolean(std::all_of(cps.begin(), cps.end(), is_ascii));
}

Result<Value> m_islower(Interpreter&, const Value& s, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("islower", args, {}).status());
  return Value::boolean(py_islower(s.as_string()));
}

Result<Value> m_isupper(Interpreter&, const Value& s, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("isupper", args, {}).status());
  return Value::boolean(py_isupper(s.as_string()));
}

Result<Value> partition_method(const Value& self, CallArgs& args, const char* name, bool right) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"sep", {}}}));
  SE_ASSIGN_OR_RETURN(std::string sep, str_arg(a[0], "must be str"));
  if (sep.empty()) return invalid_argument("ValueError: empty separator");
  const std::string& s = self.as_string();
  size_t hit = right ? s.rfind(sep) : s.find(sep);
  if (hit == std::string::npos) {
    return right ? Value::tuple({Value::string(""), Value::string(""), self})
                 : Value::tuple({self, Value::string(""), Value::string("")});
  }
  return Value::tuple({Value::string(s.substr(0, hit)), Value::string(sep),
                       Value::string(s.substr(hit + sep.size()))});
}

Result<Value> m_partition(Interpreter&, const Value& s, CallArgs& a) {
  return partition_method(s, a, "partition", false);
}
Result<Value> m_rpartition(Interpreter&, const Value& s, CallArgs& a) {
  return partition_method(s, a, "rpartition", true);
}

Result<Value> m_removeprefix(Interpreter&, const Value& s, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("removeprefix", args, {{"prefix", {}}}));
  SE_ASSIGN_OR_RETURN(std::string p, str_arg(a[0], "removeprefix() argument"));
  const std::string& str = s.as_string();
  return str.rfind(p, 0) == 0 ? Value::string(str.substr(p.size())) : s;
}

Result<Value> m_removesuffix(Interpreter&, const Value& s, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("removesuffix", args, {{"suffix", {}}}));
  SE_ASSIGN_OR_RETURN(std::string p, str_arg(a[0], "removesuffix() argument"));
  const std::string& str = s.as_string();
  bool ends =
      !p.empty() && str.size() >= p.size() && str.compare(str.size() - p.size(), p.size(), p) == 0;
  return ends ? Value::string(str.substr(0, str.size() - p.size())) : s;
}

Result<Value> pad_method(Interpreter& interp, const Value& self, CallArgs& args, const char* name,
                         int kind) {
  SE_ASSIGN_OR_RETURN(auto a,
                      bind_args(name, args, {{"width", {}}, {"fillchar", Value::string(" ")}}));
  SE_ASSIGN_OR_RETURN(int64_t width, int_arg(a[0], "width"));
  SE_RETURN_IF_ERROR(interp.check_string_size(static_cast<size_t>(std::max<int64_t>(0, width))));
  if (!a[1].is_string() || utf8_length(a[1].as_string()) != 1) {
    return type_error("The fill character must be exactly one character long");
  }
  char32_t fill = utf8_decode(a[1].as_string()).front();
  const std::string& s = self.as_string();
  if (kind == 0) return Value::string(py_ljust(s, width, fill));
  if (kind == 1) return Value::string(py_rjust(s, width, fill));
  return Value::string(py_center(s, width, fill));
}

Result<Value> m_ljust(Interpreter& i, const Value& s, CallArgs& a) {
  return pad_method(i, s, a, "ljust", 0);
}
Result<Value> m_rjust(Interpreter& i, const Value& s, CallArgs& a) {
  return pad_method(i, s, a, "rjust", 1);
}
Result<Value> m_center(Interpreter& i, const Value& s, CallArgs& a) {
  return pad_method(i, s, a, "center", 2);
}

Result<Value> m_zfill(Interpreter& interp, const Value& self, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("zfill", args, {{"width", {}}}));
  SE_ASSIGN_OR_RETURN(int64_t width, int_arg(a[0], "width"));
  SE_RETURN_IF_ERROR(interp.check_string_size(static_cast<size_t>(std::max<int64_t>(0, width))));
  std::string s = self.as_string();
  const auto len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return self;
  size_t sign = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  s.insert(sign, std::string(static_cast<size_t>(width - len), '0'));
  return Value::string(std::move(s));
}

Result<Value> m_format(Interpreter& interp, const Value& s, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(std::string out, str_format(interp, s.as_string(), args));
  return Value::string(std::move(out));
}

constexpr MethodEntry kStrMethods[] = {
    {"startswith", m_startswith},
    {"endswith", m_endswith},
    {"strip", m_strip},
    {"lstrip", m_lstrip},
    {"rstrip", m_rstrip},
    {"split", m_split},
    {"rsplit", m_rsplit},
    {"splitlines", m_splitlines},
    {"upper", case_method<py_upper>},
    {"lower", case_method<py_lower>},
    {"casefold", case_method<py_lower>},
    {"title", case_method<py_title>},
    {"capitalize", case_method<py_capitalize>},
    {"swapcase", case_method<py_swapcase>},
    {"replace", m_replace},
    {"find", m_find},
    {"rfind", m_rfind},
    {"index", m_index},
    {"rindex", m_rindex},
    {"count", m_count},
    {"join", m_join},
    {"format", m_format},
    {"isdigit", all_chars<py_isdigit>},
    {"isdecimal", all_chars<py_isdigit>},
    {"isnumeric", all_chars<py_isdigit>},
    {"isalpha", all_chars<py_isalpha>},
    {"isalnum", all_chars<py_isalnum>},
    {"isspace", all_chars<py_isspace>},
    {"isascii", m_isascii},
    {"islower", m_islower},
    {"isupper", m_isupper},
    {"partition", m_partition},
    {"rpartition", m_rpartition},
    {"removeprefix", m_removeprefix},
    {"removesuffix", m_removesuffix},
    {"ljust", m_ljust},
    {"rjust", m_rjust},
    {"center", m_center},
    {"zfill", m_zfill},
    {"encode", unsupported_method},
    {"expandtabs", unsupported_method},
    {"format_map", unsupported_method},
    {"isidentifier", unsupported_method},
    {"isprintable", unsupported_method},
    {"istitle", unsupported_method},
    {"maketrans", unsupported_method},
    {"translate", unsupported_method},
};

}  // namespace

const MethodEntry* find_str_method(std::string_view name) {
  for (const MethodEntry& e : kStrMethods) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace se::jinja
