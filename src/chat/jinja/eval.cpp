// Expression evaluation and jinja2's sandboxed attribute/item access.
#include <algorithm>

#include "chat/jinja/builtins.h"
#include "chat/jinja/generators.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/loop_state.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

Value missing_attribute(const Value& object, const std::string& name) {
  return Value::undefined(fmt::format(
      "{} has no attribute {}", py_repr_string(py_object_type_repr(object)), py_repr_string(name)));
}

Value missing_item(const Value& object, const Value& key) {
  if (key.is_string()) return missing_attribute(object, key.as_string());
  return Value::undefined(
      fmt::format("{} has no element {}", py_object_type_repr(object), py_repr(key)));
}

// The properties of jinja2's LoopContext; undefined when `name` is not one.
Value loop_attribute(const Value& loop_value, const std::string& name, bool* found) {
  const LoopState& loop = loop_value.as_loop();
  const auto length = static_cast<int64_t>(loop.items.size());
  const auto index0 = static_cast<int64_t>(loop.index0);
  *found = true;
  if (name == "index") return Value::integer(index0 + 1);
  if (name == "index0") return Value::integer(index0);
  if (name == "revindex") return Value::integer(length - index0);
  if (name == "revindex0") return Value::integer(length - index0 - 1);
  if (name == "first") return Value::boolean(index0 == 0);
  if (name == "last") return Value::boolean(index0 + 1 == length || loop.rest_consumed);
  if (name == "length") return Value::integer(length);
  if (name == "depth") return Value::integer(loop.depth0 + 1);
  if (name == "depth0") return Value::integer(loop.depth0);
  if (name == "previtem") {
    return index0 > 0 ? loop.items[loop.index0 - 1] : Value::undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return index0 + 1 < length && !loop.rest_consumed ? loop.items[loop.index0 + 1]
                                                      : Value::undefined("there is no next item");
  }
  *found = false;
  return Value();
}

}  // namespace

Result<Value> Interpreter::eval(const ast::Expr& expr, const std::shared_ptr<Scope>& scope) {
  struct LevelExit {
    int& depth;
    ~LevelExit() { --depth; }
  } level_exit{eval_depth_};
  Status step = enter_level();
  if (step.is_ok()) step = count_step();
  if (!step.is_ok()) return locate(step, expr.pos);
  Result<Value> result = eval_inner(expr, scope);
  if (!result.is_ok()) return locate(result.status(), expr.pos);
  return result;
}

Result<Value> Interpreter::lookup(const std::string& name, const Scope& scope) const {
  if (const Value* v = scope.find(name)) return *v;
  Value global = find_global(name);
  if (!global.is_undefined()) return global;
  return Value::undefined(fmt::format("{} is undefined", py_repr_string(name)));
}

Result<CallArgs> Interpreter::eval_args(const ast::Args& args,
                                        const std::shared_ptr<Scope>& scope) {
  CallArgs out;
  for (const ast::ExprPtr& e : args.positional) {
    SE_ASSIGN_OR_RETURN(Value v, eval(*e, scope));
    out.positional.push_back(std::move(v));
  }
  for (const auto& [name, e] : args.keyword) {
    SE_ASSIGN_OR_RETURN(Value v, eval(*e, scope));
    out.keyword.emplace_back(name, std::move(v));
  }
  return out;
}

Result<Value> Interpreter::eval_inner(const ast::Expr& expr, const std::shared_ptr<Scope>& scope) {
  switch (expr.kind) {
    case ast::ExprKind::kLiteral:
      return static_cast<const ast::LiteralExpr&>(expr).value;
    case ast::ExprKind::kName:
      return lookup(static_cast<const ast::NameExpr&>(expr).name, *scope);
    case ast::ExprKind::kList: {
      const auto& e = static_cast<const ast::ListExpr&>(expr);
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const ast::ExprPtr& item : e.items) {
        SE_ASSIGN_OR_RETURN(Value v, eval(*item, scope));
        items.push_back(std::move(v));
      }
      return e.is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case ast::ExprKind::kDict: {
      Dict dict;
      for (const auto& [key_expr, value_expr] : static_cast<const ast::DictExpr&>(expr).items) {
        SE_ASSIGN_OR_RETURN(Value key, eval(*key_expr, scope));
        SE_ASSIGN_OR_RETURN(Value value, eval(*value_expr, scope));
        if (key.kind() == ValueKind::kList || key.kind() == ValueKind::kDict) {
          return type_error(fmt::format("unhashable type: '{}'", py_type_name(key)));
        }
        dict.set(std::move(key), std::move(value));
      }
      return Value::dict(std::move(dict));
    }
    case ast::ExprKind::kGetAttr: {
      const auto& e = static_cast<const ast::GetAttrExpr&>(expr);
      SE_ASSIGN_OR_RETURN(Value object, eval(*e.object, scope));
      return get_attr(object, e.name);
    }
    case ast::ExprKind::kGetItem: {
      const auto& e = static_cast<const ast::GetItemExpr&>(expr);
      SE_ASSIGN_OR_RETURN(Value object, eval(*e.object, scope));
      if (e.index->kind == ast::ExprKind::kSlice) {
        const auto& s = static_cast<const ast::SliceExpr&>(*e.index);
        Value parts[3] = {Value::none(), Value::none(), Value::none()};
        const ast::ExprPtr* exprs[3] = {&s.start, &s.stop, &s.step};
        for (int i = 0; i < 3; ++i) {
          if (*exprs[i]) {
            SE_ASSIGN_OR_RETURN(parts[i], eval(**exprs[i], scope));
          }
        }
        return slice_value(object, parts[0], parts[1], parts[2]);
      }
      SE_ASSIGN_OR_RETURN(Value key, eval(*e.index, scope));
      return get_item(object, key);
    }
    case ast::ExprKind::kSlice:
      return internal_error("slice outside of a subscript");
    case ast::ExprKind::kCall: {
      const auto& e = static_cast<const ast::CallExpr&>(expr);
      SE_ASSIGN_OR_RETURN(Value callee, eval(*e.callee, scope));
      SE_ASSIGN_OR_RETURN(CallArgs args, eval_args(e.args, scope));
      return call(callee, std::move(args));
    }
    case ast::ExprKind::kFilter: {
      const auto& e = static_cast<const ast::FilterExpr&>(expr);
      SE_ASSIGN_OR_RETURN(Value input, eval(*e.operand, scope));
      return eval_filter(e, input, scope);
    }
    case ast::ExprKind::kTest: {
      const auto& e = static_cast<const ast::TestExpr&>(expr);
      if (!e.known) {
        return invalid_argument("TemplateRuntimeError: No test named {} found.",
                                py_repr_string(e.name));
      }
      SE_ASSIGN_OR_RETURN(Value input, eval(*e.operand, scope));
      SE_ASSIGN_OR_RETURN(CallArgs args, eval_args(e.args, scope));
      SE_ASSIGN_OR_RETURN(bool result, call_test(e.name, input, std::move(args)));
      return Value::boolean(result);
    }
    case ast::ExprKind::kNot: {
      SE_ASSIGN_OR_RETURN(Value v, eval(*static_cast<const ast::UnaryExpr&>(expr).operand, scope));
      return Value::boolean(!v.truthy());
    }
    case ast::ExprKind::kNeg: {
      SE_ASSIGN_OR_RETURN(Value v, eval(*static_cast<const ast::UnaryExpr&>(expr).operand, scope));
      return unary_negate(v);
    }
    case ast::ExprKind::kPos: {
      SE_ASSIGN_OR_RETURN(Value v, eval(*static_cast<const ast::UnaryExpr&>(expr).operand, scope));
      return unary_plus(v);
    }
    case ast::ExprKind::kBinary: {
      const auto& e = static_cast<const ast::BinaryExpr&>(expr);
      SE_ASSIGN_OR_RETURN(Value lhs, eval(*e.lhs, scope));
      SE_ASSIGN_OR_RETURN(Value rhs, eval(*e.rhs, scope));
      return binary_op(*this, e.op, lhs, rhs);
    }
    case ast::ExprKind::kAnd:
    case ast::ExprKind::kOr: {
      const auto& e = static_cast<const ast::LogicalExpr&>(expr);
      SE_ASSIGN_OR_RETURN(Value lhs, eval(*e.lhs, scope));
      bool short_circuit = expr.kind == ast::ExprKind::kAnd ? !lhs.truthy() : lhs.truthy();
      if (short_circuit) return lhs;
      return eval(*e.rhs, scope);
    }
    case ast::ExprKind::kConcat: {
      std::string out;
      for (const ast::ExprPtr& part : static_cast<const ast::ConcatExpr&>(expr).parts) {
        SE_ASSIGN_OR_RETURN(Value v, eval(*part, scope));
        out += py_str(v);
        SE_RETURN_IF_ERROR(check_string_size(out.size()));
      }
      return Value::string(std::move(out));
    }
    case ast::ExprKind::kCompare:
      return eval_compare(static_cast<const ast::CompareExpr&>(expr), scope);
    case ast::ExprKind::kCondition: {
      const auto& e = static_cast<const ast::ConditionExpr&>(expr);
      SE_ASSIGN_OR_RETURN(Value test, eval(*e.test, scope));
      if (test.truthy()) return eval(*e.then_expr, scope);
      if (e.else_expr) return eval(*e.else_expr, scope);
      return Value::undefined(fmt::format(
          "the inline if-expression on line {} evaluated to false and no else section was defined.",
          expr.pos.line));
    }
  }
  return internal_error("unknown expression kind");
}

Result<Value> Interpreter::eval_compare(const ast::CompareExpr& expr,
                                        const std::shared_ptr<Scope>& scope) {
  SE_ASSIGN_OR_RETURN(Value lhs, eval(*expr.first, scope));
  for (const auto& [op, rhs_expr] : expr.rest) {
    SE_ASSIGN_OR_RETURN(Value rhs, eval(*rhs_expr, scope));
    SE_ASSIGN_OR_RETURN(bool ok, compare_op(*this, op, lhs, rhs));
    if (!ok) return Value::boolean(false);
    lhs = std::move(rhs);
  }
  return Value::boolean(true);
}

Result<Value> Interpreter::eval_filter(const ast::FilterExpr& expr, const Value& input,
                                       const std::shared_ptr<Scope>& scope) {
  if (!expr.known) {
    return invalid_argument("TemplateRuntimeError: No filter named {} found.",
                            py_repr_string(expr.name));
  }
  SE_ASSIGN_OR_RETURN(CallArgs args, eval_args(expr.args, scope));
  return call_filter(expr.name, input, std::move(args));
}

Result<Value> Interpreter::call_filter(std::string_view name, const Value& input, CallArgs args) {
  FilterFn fn = find_filter(name);
  if (fn == nullptr) {
    return invalid_argument("TemplateRuntimeError: No filter named {}.",
                            py_repr_string(std::string(name)));
  }
  SE_ASSIGN_OR_RETURN(Value out, fn(*this, input, args));
  SE_RETURN_IF_ERROR(check_nesting(out));
  return out;
}

Result<bool> Interpreter::call_test(std::string_view name, const Value& input, CallArgs args) {
  TestFn fn = find_test(name);
  if (fn == nullptr) {
    return invalid_argument("TemplateRuntimeError: No test named {}.",
                            py_repr_string(std::string(name)));
  }
  return fn(*this, input, args);
}

Result<Value> Interpreter::call(const Value& callee, CallArgs args) {
  switch (callee.kind()) {
    case ValueKind::kCallable: {
      SE_ASSIGN_OR_RETURN(Value out, callee.as_callable()->call(*this, std::move(args)));
      SE_RETURN_IF_ERROR(check_nesting(out));
      return out;
    }
    case ValueKind::kLoop:
      return call_loop(callee, std::move(args));
    case ValueKind::kUndefined:
      return undefined_error(callee);
    default:
      return type_error(fmt::format("'{}' object is not callable", py_type_name(callee)));
  }
}

Result<Value> Interpreter::get_attr(const Value& object, const std::string& name) {
  if (object.is_undefined()) return undefined_error(object);
  bool found = false;
  Value method = find_method(object, name, &found);
  if (found) return method;
  switch (object.kind()) {
    case ValueKind::kDict:
      if (const Value* v = object.as_dict().find(std::string_view(name))) return *v;
      break;
    case ValueKind::kNamespace:
      if (const Value* v = object.as_namespace().attrs.find(std::string_view(name))) return *v;
      break;
    case ValueKind::kLoop: {
      Value v = loop_attribute(object, name, &found);
      if (found) return v;
      break;
    }
    case ValueKind::kRange: {
      auto bounds = object.range_bounds();
      if (name == "start") return Value::integer(bounds[0]);
      if (name == "stop") return Value::integer(bounds[1]);
      if (name == "step") return Value::integer(bounds[2]);
      break;
    }
    default:
      break;
  }
  return missing_attribute(object, name);
}

Result<Value> Interpreter::get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) return undefined_error(object);
  switch (object.kind()) {
    case ValueKind::kDict:
      if (key.kind() != ValueKind::kList && key.kind() != ValueKind::kDict) {
        if (const Value* v = object.as_dict().find(key)) return *v;
      }
      break;
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange:
      if (auto index = as_index(key)) {
        const auto size = static_cast<int64_t>(object.items().size());
        int64_t i = *index < 0 ? *index + size : *index;
        if (i >= 0 && i < size) return object.items()[static_cast<size_t>(i)];
      }
      break;
    case ValueKind::kString:
      if (auto index = as_index(key)) {
        std::u32string chars = utf8_decode(object.as_string());
        const auto size = static_cast<int64_t>(chars.size());
        int64_t i = *index < 0 ? *index + size : *index;
        if (i >= 0 && i < size) {
          std::string c;
          append_utf8(c, chars[static_cast<size_t>(i)]);
          return Value::string(std::move(c), object.is_markup());
        }
      }
      break;
    default:
      break;
  }
  // Subscription failed: jinja2 retries a string key as an attribute (never as a dict key again).
  if (key.is_string()) {
    bool found = false;
    Value method = find_method(object, key.as_string(), &found);
    if (found) return method;
    if (object.kind() == ValueKind::kNamespace) {
      if (const Value* v = object.as_namespace().attrs.find(std::string_view(key.as_string()))) {
        return *v;
      }
    }
    if (object.kind() == ValueKind::kLoop) {
      Value v = loop_attribute(object, key.as_string(), &found);
      if (found) return v;
    }
  }
  return missing_item(object, key);
}

Result<std::vector<Value>> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return std::vector<Value>{};
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange:
    case ValueKind::kDictView:
      return v.items();
    case ValueKind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().size());
      for (const auto& [key, value] : v.as_dict().items()) keys.push_back(key);
      return keys;
    }
    case ValueKind::kString: {
      std::vector<Value> chars;
      for (char32_t cp : utf8_decode(v.as_string())) {
        std::string c;
        append_utf8(c, cp);
        chars.push_back(Value::string(std::move(c), v.is_markup()));
      }
      return chars;
    }
    case ValueKind::kLoop:
      return v.as_loop().take_rest(v);
    case ValueKind::kIterator: {
      std::vector<Value> rest;
      while (true) {
        SE_ASSIGN_OR_RETURN(std::optional<Value> item, generator_next(*this, v.as_iterator()));
        if (!item) return rest;
        rest.push_back(std::move(*item));
      }
    }
    default:
      return type_error(fmt::format("'{}' object is not iterable", py_type_name(v)));
  }
}

}  // namespace se::jinja
