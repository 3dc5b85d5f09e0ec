// Global functions of transformers' chat-template environment: range (sandboxed to 100000 items),
// dict, namespace, raise_exception, strftime_now, and jinja2's joiner; cycler and lipsum exist (so
// `is defined` agrees with jinja2) but cannot be called.
#include <ctime>

#include "chat/jinja/builtin_args.h"
#include "chat/jinja/builtins.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"

namespace se::jinja {
namespace {

using GlobalFn = Result<Value> (*)(Interpreter&, CallArgs&);

class BuiltinFunction final : public Callable {
 public:
  BuiltinFunction(std::string_view name, GlobalFn fn) : name_(name), fn_(fn) {}
  Result<Value> call(Interpreter& interp, CallArgs args) override { return fn_(interp, args); }
  std::string repr() const override { return fmt::format("<built-in function {}>", name_); }

 private:
  std::string_view name_;
  GlobalFn fn_;
};

constexpr int64_t kMaxRange = 100000;

Result<Value> g_range(Interpreter&, CallArgs& args) {
  if (!args.keyword.empty()) return type_error("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) {
    return type_error(fmt::format("range expected at most 3 arguments, got {}", p.size()));
  }
  for (const Value& v : p) {
    if (!v.is_integral()) {
      return type_error(
          fmt::format("'{}' object cannot be interpreted as an integer", py_type_name(v)));
    }
  }
  int64_t start = p.size() == 1 ? 0 : p[0].as_int();
  int64_t stop = p.size() == 1 ? p[0].as_int() : p[1].as_int();
  int64_t step = p.size() == 3 ? p[2].as_int() : 1;
  if (step == 0) return invalid_argument("ValueError: range() arg 3 must not be zero");
  // Length computed in long double to avoid overflow on extreme bounds.
  long double span =
      step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
  long double count = span <= 0 ? 0
                                : (span + std::abs(static_cast<long double>(step)) - 1) /
                                      std::abs(static_cast<long double>(step));
  if (count > kMaxRange) {
    return invalid_argument(
        "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).",
        kMaxRange);
  }
  return Value::range(start, stop, step);
}

// dict(mapping_or_pairs, **kwargs) and namespace(...), which accept the same arguments.
Result<Dict> dict_from_args(Interpreter& interp, const CallArgs& args, const char* name) {
  if (args.positional.size() > 1) {
    return type_error(
        fmt::format("{} expected at most 1 argument, got {}", name, args.positional.size()));
  }
  Dict out;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.kind() == ValueKind::kDict) {
      out = source.as_dict();
    } else {
      SE_ASSIGN_OR_RETURN(std::vector<Value> pairs, interp.iterate(source));
      for (size_t i = 0; i < pairs.size(); ++i) {
        SE_ASSIGN_OR_RETURN(std::vector<Value> kv, interp.iterate(pairs[i]));
        if (kv.size() != 2) {
          return invalid_argument(
              "ValueError: dictionary update sequence element #{} has length {}; 2 is required", i,
              kv.size());
        }
        if (kv[0].kind() == ValueKind::kList || kv[0].kind() == ValueKind::kDict) {
          return type_error(fmt::format("unhashable type: '{}'", py_type_name(kv[0])));
        }
        out.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keyword) out.set(Value::string(key), value);
  return out;
}

Result<Value> g_dict(Interpreter& interp, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(Dict d, dict_from_args(interp, args, "dict"));
  return Value::dict(std::move(d));
}

Result<Value> g_namespace(Interpreter& interp, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  SE_ASSIGN_OR_RETURN(ns->attrs, dict_from_args(interp, args, "namespace"));
  for (const auto& [key, value] : ns->attrs.items()) {
    if (key.is_string() && !key.as_string().empty() && key.as_string()[0] == '_') {
      return invalid_argument(
          "SecurityError: Chat templates cannot store underscore-prefixed attributes on a "
          "namespace, but got {}. Please rename the attribute.",
          py_repr_string(key.as_string()));
    }
  }
  return interp.track(Value::namespace_object(std::move(ns)));
}

Result<Value> g_raise_exception(Interpreter& interp, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("raise_exception", args, {{"message", {}}}));
  interp.mark_template_error();
  return invalid_argument("{}", py_str(a[0]));
}

// datetime.now().strftime(format): C strftime, with datetime's own %f and the empty %z/%Z of a
// naive datetime.
Result<Value> g_strftime_now(Interpreter& interp, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("strftime_now", args, {{"format", {}}}));
  if (!a[0].is_string()) {
    return type_error(fmt::format("strftime() argument 1 must be str, not {}", py_type_name(a[0])));
  }
  const std::string& format = a[0].as_string();
  std::string prepared;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      char c = format[i + 1];
      if (c == 'f') {
        prepared += "000000";
        ++i;
        continue;
      }
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      prepared.push_back('%');
      prepared.push_back(c);
      ++i;
      continue;
    }
    prepared.push_back(format[i]);
  }
  // A sentinel tells an empty result apart from a too-small buffer.
  prepared.push_back('\x01');
  std::string out(prepared.size() * 4 + 64, '\0');
  const std::tm now = interp.now();
  while (true) {
    size_t n = std::strftime(out.data(), out.size(), prepared.c_str(), &now);
    if (n > 0) {
      out.resize(n - 1);
      break;
    }
    SE_RETURN_IF_ERROR(interp.check_string_size(out.size() * 2));
    out.resize(out.size() * 2);
  }
  return Value::string(std::move(out));
}

// joiner(sep): a function returning "" on its first call and `sep` afterwards.
class Joiner final : public Callable {
 public:
  explicit Joiner(std::string sep) : sep_(std::move(sep)) {}
  Result<Value> call(Interpreter&, CallArgs args) override {
    SE_RETURN_IF_ERROR(bind_args("joiner", args, {}).status());
    if (!used_) {
      used_ = true;
      return Value::string("");
    }
    return Value::string(sep_);
  }
  std::string repr() const override { return "<jinja2.utils.Joiner object>"; }

 private:
  std::string sep_;
  bool used_ = false;
};

Result<Value> g_joiner(Interpreter&, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("joiner", args, {{"sep", Value::string(", ")}}));
  return Value::callable(std::make_shared<Joiner>(py_str(a[0])));
}

Result<Value> g_not_supported(Interpreter&, CallArgs&) {
  return invalid_argument("cycler() and lipsum() are not supported");
}

Value make_global(std::string_view name, GlobalFn fn) {
  return Value::callable(std::make_shared<BuiltinFunction>(name, fn));
}

}  // namespace

Value find_global(std::string_view name) {
  static const Value kRange = make_global("range", g_range);
  static const Value kDict = make_global("dict", g_dict);
  static const Value kNamespace = make_global("namespace", g_namespace);
  static const Value kRaise = make_global("raise_exception", g_raise_exception);
  static const Value kStrftime = make_global("strftime_now", g_strftime_now);
  static const Value kJoiner = make_global("joiner", g_joiner);
  static const Value kCycler = make_global("cycler", g_not_supported);
  static const Value kLipsum = make_global("lipsum", g_not_supported);
  if (name == "range") return kRange;
  if (name == "dict") return kDict;
  if (name == "namespace") return kNamespace;
  if (name == "raise_exception") return kRaise;
  if (name == "strftime_now") return kStrftime;
  if (name == "joiner") return kJoiner;
  if (name == "cycler") return kCycler;
  if (name == "lipsum") return kLipsum;
  return Value();
}

}  // namespace se::jinja
