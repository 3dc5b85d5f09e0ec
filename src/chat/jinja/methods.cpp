// Methods of built-in values reachable from templates: the str methods (str_methods.cpp), the
// read-only dict and list methods, and loop.cycle / loop.changed. Mutating list/dict methods
// resolve, as in jinja2's ImmutableSandboxedEnvironment, to an undefined value whose use raises a
// SecurityError.
#include <algorithm>

#include "chat/jinja/builtin_args.h"
#include "chat/jinja/builtins_internal.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/loop_state.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"

namespace se::jinja {
namespace {

class BoundMethod final : public Callable {
 public:
  BoundMethod(Value self, std::string name, MethodFn fn)
      : self_(std::move(self)), name_(std::move(name)), fn_(fn) {}
  Result<Value> call(Interpreter& interp, CallArgs args) override {
    return fn_(interp, self_, args);
  }
  std::string repr() const override {
    return fmt::format(
        "<built-in method {} of {} object at {}>", name_, py_type_name(self_),
        self_.identity() != nullptr ? self_.identity() : static_cast<const void*>(this));
  }

 private:
  Value self_;
  std::string name_;
  MethodFn fn_;
};

// --- dict ---
Result<Value> m_items(Interpreter&, const Value& d, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("items", args, {}).status());
  return Value::dict_view(d.as_dict(), Value::View::kItems);
}

Result<Value> m_keys(Interpreter&, const Value& d, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("keys", args, {}).status());
  return Value::dict_view(d.as_dict(), Value::View::kKeys);
}

Result<Value> m_values(Interpreter&, const Value& d, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("values", args, {}).status());
  return Value::dict_view(d.as_dict(), Value::View::kValues);
}

Result<Value> m_get(Interpreter&, const Value& d, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("get", args, {{"key", {}}, {"default", Value::none()}}));
  if (a[0].kind() == ValueKind::kList || a[0].kind() == ValueKind::kDict) {
    return type_error(fmt::format("unhashable type: '{}'", py_type_name(a[0])));
  }
  const Value* v = d.as_dict().find(a[0]);
  return v != nullptr ? *v : a[1];
}

Result<Value> m_copy(Interpreter&, const Value& self, CallArgs& args) {
  SE_RETURN_IF_ERROR(bind_args("copy", args, {}).status());
  return self.kind() == ValueKind::kDict ? Value::dict(self.as_dict()) : Value::list(self.items());
}

// --- list / tuple ---
Result<Value> m_list_index(Interpreter&, const Value& l, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("index", args, {{"value", {}}}));
  const auto& items = l.items();
  for (size_t i = 0; i < items.size(); ++i) {
    if (py_equal(items[i], a[0])) return Value::integer(static_cast<int64_t>(i));
  }
  return invalid_argument("ValueError: {} is not in {}", py_repr(a[0]), py_type_name(l));
}

Result<Value> m_list_count(Interpreter&, const Value& l, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("count", args, {{"value", {}}}));
  int64_t n = 0;
  for (const Value& v : l.items()) n += py_equal(v, a[0]) ? 1 : 0;
  return Value::integer(n);
}

// --- loop ---
Result<Value> m_cycle(Interpreter&, const Value& loop, CallArgs& args) {
  if (args.positional.empty()) return type_error("no items for cycling given");
  return args.positional[loop.as_loop().index0 % args.positional.size()];
}

Result<Value> m_changed(Interpreter&, const Value& loop, CallArgs& args) {
  LoopState& state = loop.as_loop();
  bool same = state.changed_called && state.last_changed.size() == args.positional.size() &&
              std::equal(args.positional.begin(), args.positional.end(), state.last_changed.begin(),
                         py_equal);
  if (same) return Value::boolean(false);
  state.changed_called = true;
  state.last_changed = args.positional;
  return Value::boolean(true);
}

constexpr MethodEntry kDictMethods[] = {
    {"items", m_items},      {"keys", m_keys},    {"values", m_values},
    {"get", m_get},          {"copy", m_copy},    {"fromkeys", unsupported_method},
    {"clear", nullptr},      {"pop", nullptr},    {"popitem", nullptr},
    {"setdefault", nullptr}, {"update", nullptr},
};

constexpr MethodEntry kListMethods[] = {
    {"index", m_list_index}, {"count", m_list_count}, {"copy", m_copy},    {"append", nullptr},
    {"clear", nullptr},      {"extend", nullptr},     {"insert", nullptr}, {"pop", nullptr},
    {"remove", nullptr},     {"reverse", nullptr},    {"sort", nullptr},
};

constexpr MethodEntry kTupleMethods[] = {{"index", m_list_index}, {"count", m_list_count}};

constexpr MethodEntry kLoopMethods[] = {{"cycle", m_cycle}, {"changed", m_changed}};

template <size_t N>
const MethodEntry* lookup(const MethodEntry (&table)[N], const std::string& name) {
  for (const MethodEntry& e : table) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

Result<Value> unsupported_method(Interpreter&, const Value& s, CallArgs&) {
  return invalid_argument("{} methods beyond the common ones are not supported", py_type_name(s));
}

Value find_method(const Value& object, const std::string& name, bool* found) {
  const MethodEntry* entry = nullptr;
  switch (object.kind()) {
    case ValueKind::kString:
      entry = find_str_method(name);
      break;
    case ValueKind::kDict:
      entry = lookup(kDictMethods, name);
      break;
    case ValueKind::kList:
      entry = lookup(kListMethods, name);
      break;
    case ValueKind::kTuple:
    case ValueKind::kRange:
      entry = lookup(kTupleMethods, name);
      break;
    case ValueKind::kLoop:
      entry = lookup(kLoopMethods, name);
      break;
    default:
      break;
  }
  *found = entry != nullptr;
  if (entry == nullptr) return Value();
  if (entry->fn == nullptr) {
    return Value::undefined(fmt::format("access to attribute {} of {} object is unsafe.",
                                        py_repr_string(name),
                                        py_repr_string(py_type_name(object))));
  }
  return Value::callable(std::make_shared<BoundMethod>(object, name, entry->fn));
}

}  // namespace se::jinja
