#include "chat/jinja/operators.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "chat/jinja/generators.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/loop_state.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

const char* op_symbol(ast::BinaryOp op) {
  switch (op) {
    case ast::BinaryOp::kAdd:
      return "+";
    case ast::BinaryOp::kSub:
      return "-";
    case ast::BinaryOp::kMul:
      return "*";
    case ast::BinaryOp::kDiv:
      return "/";
    case ast::BinaryOp::kFloorDiv:
      return "//";
    case ast::BinaryOp::kMod:
      return "%";
    case ast::BinaryOp::kPow:
      return "** or pow()";
  }
  return "?";
}

Status unsupported(ast::BinaryOp op, const Value& a, const Value& b) {
  return type_error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op_symbol(op),
                                py_type_name(a), py_type_name(b)));
}

Status overflow() { return invalid_argument("OverflowError: integer result exceeds 64 bits"); }

Result<Value> repeat(Interpreter& interp, const Value& seq, int64_t count) {
  if (count <= 0) {
    if (seq.is_string()) return Value::string("", seq.is_markup());
    return seq.kind() == ValueKind::kTuple ? Value::tuple({}) : Value::list({});
  }
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(count) > (uint64_t{1} << 40) / s.size()) {
      return interp.check_string_size(SIZE_MAX);
    }
    SE_RETURN_IF_ERROR(interp.check_string_size(s.size() * static_cast<size_t>(count)));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) out += s;
    return Value::string(std::move(out), seq.is_markup());
  }
  const auto& items = seq.items();
  if (!items.empty() && static_cast<uint64_t>(count) > (uint64_t{1} << 40) / items.size()) {
    return interp.check_string_size(SIZE_MAX);
  }
  // List elements are at least a Value each; bound them like bytes of output.
  SE_RETURN_IF_ERROR(interp.check_string_size(items.size() * static_cast<size_t>(count)));
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.kind() == ValueKind::kTuple ? Value::tuple(std::move(out))
                                         : Value::list(std::move(out));
}

// Python's float divmod rules (Objects/floatobject.c).
void float_divmod(double vx, double wx, double* floordiv, double* mod) {
  double m = std::fmod(vx, wx);
  double div = (vx - m) / wx;
  if (m != 0.0) {
    if ((wx < 0) != (m < 0)) {
      m += wx;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0.0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *mod = m;
}

Result<Value> arithmetic(ast::BinaryOp op, const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral() && op != ast::BinaryOp::kDiv) {
    int64_t x = a.as_int();
    int64_t y = b.as_int();
    int64_t r;
    switch (op) {
      case ast::BinaryOp::kAdd:
        if (__builtin_add_overflow(x, y, &r)) return overflow();
        return Value::integer(r);
      case ast::BinaryOp::kSub:
        if (__builtin_sub_overflow(x, y, &r)) return overflow();
        return Value::integer(r);
      case ast::BinaryOp::kMul:
        if (__builtin_mul_overflow(x, y, &r)) return overflow();
        return Value::integer(r);
      case ast::BinaryOp::kFloorDiv:
      case ast::BinaryOp::kMod: {
        if (y == 0)
          return invalid_argument("ZeroDivisionError: integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          if (op == ast::BinaryOp::kMod) return Value::integer(0);
          return overflow();
        }
        int64_t q = x / y;
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          m += y;
          --q;
        }
        return Value::integer(op == ast::BinaryOp::kFloorDiv ? q : m);
      }
      case ast::BinaryOp::kPow: {
        if (y < 0) return Value::floating(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t result = 1;
        int64_t base = x;
        while (y > 0) {
          if (y & 1) {
            if (__builtin_mul_overflow(result, base, &result)) return overflow();
          }
          y >>= 1;
          if (y > 0 && __builtin_mul_overflow(base, base, &base)) return overflow();
        }
        return Value::integer(result);
      }
      default:
        break;
    }
  }
  double x = a.as_float();
  double y = b.as_float();
  switch (op) {
    case ast::BinaryOp::kAdd:
      return Value::floating(x + y);
    case ast::BinaryOp::kSub:
      return Value::floating(x - y);
    case ast::BinaryOp::kMul:
      return Value::floating(x * y);
    case ast::BinaryOp::kDiv:
      if (y == 0.0) {
        return invalid_argument("{}", a.is_integral() && b.is_integral()
                                          ? "ZeroDivisionError: division by zero"
                                          : "ZeroDivisionError: float division by zero");
      }
      return Value::floating(x / y);
    case ast::BinaryOp::kFloorDiv:
    case ast::BinaryOp::kMod: {
      if (y == 0.0) {
        return invalid_argument("{}", op == ast::BinaryOp::kMod
                                          ? "ZeroDivisionError: float modulo"
                                          : "ZeroDivisionError: float floor division by zero");
      }
      double fd, m;
      float_divmod(x, y, &fd, &m);
      return Value::floating(op == ast::BinaryOp::kFloorDiv ? fd : m);
    }
    case ast::BinaryOp::kPow: {
      if (x == 0.0 && y < 0.0) {
        return invalid_argument("ZeroDivisionError: 0.0 cannot be raised to a negative power");
      }
      if (x < 0.0 && std::floor(y) != y) {
        return invalid_argument("ValueError: complex results are not supported");
      }
      return Value::floating(std::pow(x, y));
    }
  }
  return unsupported(op, a, b);
}

}  // namespace

Status undefined_error(const Value& v) {
  const std::string& hint = v.undefined_hint();
  if (hint.rfind("access to attribute", 0) == 0) return invalid_argument("SecurityError: {}", hint);
  return invalid_argument("UndefinedError: {}", hint.empty() ? "value is undefined" : hint);
}

Status type_error(const std::string& message) { return invalid_argument("TypeError: {}", message); }

std::optional<int64_t> as_index(const Value& v) {
  if (v.is_integral()) return v.as_int();
  return std::nullopt;
}

Result<Value> binary_op(Interpreter& interp, ast::BinaryOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) return undefined_error(a);
  // str % x formats before Python would ask Undefined.__rmod__, so '%s' % undefined is ''.
  if (b.is_undefined() && !(op == ast::BinaryOp::kMod && a.is_string())) return undefined_error(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  switch (op) {
    case ast::BinaryOp::kAdd:
      if (a.is_string() && b.is_string()) {
        SE_RETURN_IF_ERROR(interp.check_string_size(a.as_string().size() + b.as_string().size()));
        // Markup + str escapes the str (and str + Markup escapes the left side).
        if (a.is_markup() || b.is_markup()) {
          return Value::string(html_escape(a) + html_escape(b), true);
        }
        return Value::string(a.as_string() + b.as_string());
      }
      if ((a.kind() == ValueKind::kList && b.kind() == ValueKind::kList) ||
          (a.kind() == ValueKind::kTuple && b.kind() == ValueKind::kTuple)) {
        SE_RETURN_IF_ERROR(interp.check_string_size(a.items().size() + b.items().size()));
        std::vector<Value> items = a.items();
        items.insert(items.end(), b.items().begin(), b.items().end());
        Value out = a.kind() == ValueKind::kList ? Value::list(std::move(items))
                                                 : Value::tuple(std::move(items));
        SE_RETURN_IF_ERROR(interp.check_nesting(out));
        return out;
      }
      if (a.is_string()) {
        return type_error(
            fmt::format("can only concatenate str (not \"{}\") to str", py_type_name(b)));
      }
      if (a.kind() == ValueKind::kList) {
        return type_error(
            fmt::format("can only concatenate list (not \"{}\") to list", py_type_name(b)));
      }
      return unsupported(op, a, b);
    case ast::BinaryOp::kMul:
      if ((a.is_string() || a.is_sequence()) && b.is_integral())
        return repeat(interp, a, b.as_int());
      if ((b.is_string() || b.is_sequence()) && a.is_integral())
        return repeat(interp, b, a.as_int());
      if ((a.is_string() || a.is_sequence()) && b.is_number()) {
        return type_error(
            fmt::format("can't multiply sequence by non-int of type '{}'", py_type_name(b)));
      }
      return unsupported(op, a, b);
    case ast::BinaryOp::kMod:
      if (a.is_string()) {
        SE_ASSIGN_OR_RETURN(std::string s, percent_format(a.as_string(), b));
        SE_RETURN_IF_ERROR(interp.check_string_size(s.size()));
        return Value::string(std::move(s), a.is_markup());
      }
      return unsupported(op, a, b);
    default:
      return unsupported(op, a, b);
  }
}

Result<Value> unary_negate(const Value& v) {
  if (v.is_undefined()) return undefined_error(v);
  if (v.is_integral()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) return overflow();
    return Value::integer(-v.as_int());
  }
  if (v.kind() == ValueKind::kFloat) return Value::floating(-v.as_float());
  return type_error(fmt::format("bad operand type for unary -: '{}'", py_type_name(v)));
}

Result<Value> unary_plus(const Value& v) {
  if (v.is_undefined()) return undefined_error(v);
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.kind() == ValueKind::kFloat) return v;
  return type_error(fmt::format("bad operand type for unary +: '{}'", py_type_name(v)));
}

Result<bool> py_less(const Value& a, const Value& b) {
  if (a.is_undefined()) return undefined_error(a);
  if (b.is_undefined()) return undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int();
    return a.as_float() < b.as_float();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_sequence() && a.kind() == b.kind()) {
    const auto& x = a.items();
    const auto& y = b.items();
    size_t n = std::min(x.size(), y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!py_equal(x[i], y[i])) return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return type_error(fmt::format("'<' not supported between instances of '{}' and '{}'",
                                py_type_name(a), py_type_name(b)));
}

Result<bool> compare_op(Interpreter& interp, ast::CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case ast::CompareOp::kEq:
      return py_equal(a, b);
    case ast::CompareOp::kNe:
      return !py_equal(a, b);
    case ast::CompareOp::kLt:
      return py_less(a, b);
    case ast::CompareOp::kGt:
      return py_less(b, a);
    case ast::CompareOp::kLe: {
      if (a.is_undefined()) return undefined_error(a);
      if (b.is_undefined()) return undefined_error(b);
      SE_ASSIGN_OR_RETURN(bool greater, py_less(b, a));
      return !greater;
    }
    case ast::CompareOp::kGe: {
      if (a.is_undefined()) return undefined_error(a);
      if (b.is_undefined()) return undefined_error(b);
      SE_ASSIGN_OR_RETURN(bool less, py_less(a, b));
      return !less;
    }
    case ast::CompareOp::kIn:
      return py_contains(interp, b, a);
    case ast::CompareOp::kNotIn: {
      SE_ASSIGN_OR_RETURN(bool in, py_contains(interp, b, a));
      return !in;
    }
  }
  return false;
}

Result<bool> py_contains(Interpreter& interp, const Value& container, const Value& item) {
  switch (container.kind()) {
    case ValueKind::kString:
      if (!item.is_string()) {
        return type_error(fmt::format("'in <string>' requires string as left operand, not {}",
                                      py_type_name(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case ValueKind::kDictView:
      if (container.dict_view_kind() == Value::View::kKeys &&
          (item.kind() == ValueKind::kList || item.kind() == ValueKind::kDict)) {
        return type_error(fmt::format("unhashable type: '{}'", py_type_name(item)));
      }
      [[fallthrough]];
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kRange:
      for (const Value& v : container.items()) {
        if (py_equal(v, item)) return true;
      }
      return false;
    case ValueKind::kDict:
      if (item.kind() == ValueKind::kList || item.kind() == ValueKind::kDict) {
        return type_error(fmt::format("unhashable type: '{}'", py_type_name(item)));
      }
      return container.as_dict().find(item) != nullptr;
    case ValueKind::kUndefined:
      return false;
    case ValueKind::kLoop:
      for (const Value& v : container.as_loop().take_rest(container)) {
        if (py_equal(v, item)) return true;
      }
      return false;
    case ValueKind::kIterator:
      while (true) {
        SE_ASSIGN_OR_RETURN(std::optional<Value> v,
                            generator_next(interp, container.as_iterator()));
        if (!v) return false;
        if (py_equal(*v, item)) return true;
      }
    default:
      return type_error(
          fmt::format("argument of type '{}' is not iterable", py_type_name(container)));
  }
}

Result<Value> slice_value(const Value& obj, const Value& start_v, const Value& stop_v,
                          const Value& step_v) {
  // jinja2 compiles slices to a plain Python subscript (no sandbox getitem), so failures raise.
  if (obj.is_undefined()) return undefined_error(obj);
  if (obj.kind() == ValueKind::kDict) return type_error("unhashable type: 'slice'");
  if (!obj.is_string() && !obj.has_items()) {
    return type_error(fmt::format("'{}' object is not subscriptable", py_type_name(obj)));
  }
  std::optional<int64_t> bounds[3];
  const Value* parts[3] = {&start_v, &stop_v, &step_v};
  for (int i = 0; i < 3; ++i) {
    if (parts[i]->is_none()) continue;
    if (parts[i]->is_undefined()) return undefined_error(*parts[i]);
    if (!parts[i]->is_integral()) {
      return type_error("slice indices must be integers or None or have an __index__ method");
    }
    bounds[i] = parts[i]->as_int();
  }
  int64_t step = bounds[2].value_or(1);
  if (step == 0) return invalid_argument("ValueError: slice step cannot be zero");
  std::u32string chars;
  int64_t len;
  if (obj.is_string()) {
    chars = utf8_decode(obj.as_string());
    len = static_cast<int64_t>(chars.size());
  } else {
    len = static_cast<int64_t>(obj.items().size());
  }
  auto adjust = [&](std::optional<int64_t> v, int64_t if_none) {
    if (!v) return if_none;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = step < 0 ? len - 1 : len;
    }
    return x;
  };
  int64_t b = adjust(bounds[0], step < 0 ? len - 1 : 0);
  int64_t e = adjust(bounds[1], step < 0 ? -1 : len);
  if (obj.kind() == ValueKind::kRange) {
    // A slice of a range is a range, as in Python.
    auto [start, stop, range_step] = obj.range_bounds();
    return Value::range(start + b * range_step, start + e * range_step, range_step * step);
  }
  std::vector<int64_t> indices;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) indices.push_back(i);
  if (obj.is_string()) {
    std::u32string out;
    for (int64_t i : indices) out.push_back(chars[i]);
    return Value::string(utf8_encode(out), obj.is_markup());
  }
  std::vector<Value> out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(obj.items()[i]);
  return obj.kind() == ValueKind::kTuple ? Value::tuple(std::move(out))
                                         : Value::list(std::move(out));
}

}  // namespace se::jinja
