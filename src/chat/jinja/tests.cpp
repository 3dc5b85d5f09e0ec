// The `is` tests of jinja2/tests.py.
#include "chat/jinja/builtin_args.h"
#include "chat/jinja/builtins_internal.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"
#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

Result<Value> one_arg(std::string_view name, const CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args(name, args, {{"other", {}}}));
  return a[0];
}

Status no_args(std::string_view name, const CallArgs& args) {
  return bind_args(name, args, {}).status();
}

// value % num == 0 / == 1 with Python semantics (including the errors for strings and undefined).
Result<int64_t> py_mod_is(Interpreter& interp, const Value& value, const Value& num, int64_t want) {
  SE_ASSIGN_OR_RETURN(Value mod, binary_op(interp, ast::BinaryOp::kMod, value, num));
  return py_equal(mod, Value::integer(want)) ? 1 : 0;
}

#define SE_SIMPLE_TEST(fn, expr)                                  \
  Result<bool> fn(Interpreter&, const Value& v, CallArgs& args) { \
    SE_RETURN_IF_ERROR(no_args(#fn, args));                       \
    return (expr);                                                \
  }

SE_SIMPLE_TEST(t_defined, !v.is_undefined())
SE_SIMPLE_TEST(t_undefined, v.is_undefined())
SE_SIMPLE_TEST(t_none, v.is_none())
SE_SIMPLE_TEST(t_boolean, v.kind() == ValueKind::kBool)
SE_SIMPLE_TEST(t_false, v.kind() == ValueKind::kBool && !v.as_bool())
SE_SIMPLE_TEST(t_true, v.kind() == ValueKind::kBool && v.as_bool())
SE_SIMPLE_TEST(t_integer, v.kind() == ValueKind::kInt)
SE_SIMPLE_TEST(t_float, v.kind() == ValueKind::kFloat)
SE_SIMPLE_TEST(t_string, v.is_string())
SE_SIMPLE_TEST(t_mapping, v.kind() == ValueKind::kDict)
SE_SIMPLE_TEST(t_number, v.is_number())
SE_SIMPLE_TEST(t_escaped, v.is_markup())
SE_SIMPLE_TEST(t_lower, py_islower(py_str(v)))
SE_SIMPLE_TEST(t_upper, py_isupper(py_str(v)))
// Python: len() works and the type has __getitem__ (Undefined has both).
SE_SIMPLE_TEST(t_sequence,
               v.is_undefined() || v.is_string() || v.has_items() || v.kind() == ValueKind::kDict)
SE_SIMPLE_TEST(t_iterable, v.is_undefined() || v.is_string() || v.has_items() ||
                               v.kind() == ValueKind::kDictView || v.kind() == ValueKind::kDict ||
                               v.kind() == ValueKind::kIterator || v.kind() == ValueKind::kLoop)
// Undefined defines __call__ (to raise), so Python's callable() accepts it.
SE_SIMPLE_TEST(t_callable,
               v.kind() == ValueKind::kCallable || v.kind() == ValueKind::kLoop || v.is_undefined())
#undef SE_SIMPLE_TEST

Result<bool> t_odd(Interpreter& interp, const Value& v, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("odd", args));
  SE_ASSIGN_OR_RETURN(int64_t r, py_mod_is(interp, v, Value::integer(2), 1));
  return r == 1;
}

Result<bool> t_even(Interpreter& interp, const Value& v, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("even", args));
  SE_ASSIGN_OR_RETURN(int64_t r, py_mod_is(interp, v, Value::integer(2), 0));
  return r == 1;
}

Result<bool> t_divisibleby(Interpreter& interp, const Value& v, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("divisibleby", args, {{"num", {}}}));
  SE_ASSIGN_OR_RETURN(int64_t r, py_mod_is(interp, v, a[0], 0));
  return r == 1;
}

Result<bool> t_filter(Interpreter&, const Value& v, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("filter", args));
  if (!v.is_string()) return false;
  return find_filter(v.as_string()) != nullptr || is_unsupported_jinja_filter(v.as_string());
}

Result<bool> t_test(Interpreter&, const Value& v, CallArgs& args) {
  SE_RETURN_IF_ERROR(no_args("test", args));
  if (!v.is_string()) return false;
  return find_test(v.as_string()) != nullptr;
}

// `is` identity: the same shared object, or equal singletons and small values.
Result<bool> t_sameas(Interpreter&, const Value& v, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(Value other, one_arg("sameas", args));
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case ValueKind::kNone:
    case ValueKind::kBool:
    case ValueKind::kInt:
    case ValueKind::kFloat:
      return py_equal(v, other);
    case ValueKind::kUndefined:
      return false;
    default:
      return v.identity() == other.identity();
  }
}

Result<bool> t_in(Interpreter& interp, const Value& v, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(auto a, bind_args("in", args, {{"seq", {}}}));
  return py_contains(interp, a[0], v);
}

template <ast::CompareOp kOp>
Result<bool> t_compare(Interpreter& interp, const Value& v, CallArgs& args) {
  SE_ASSIGN_OR_RETURN(Value other, one_arg("compare", args));
  return compare_op(interp, kOp, v, other);
}

struct Entry {
  std::string_view name;
  TestFn fn;
};

constexpr Entry kTests[] = {
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"filter", t_filter},
    {"test", t_test},
    {"none", t_none},
    {"boolean", t_boolean},
    {"false", t_false},
    {"true", t_true},
    {"integer", t_integer},
    {"float", t_float},
    {"lower", t_lower},
    {"upper", t_upper},
    {"string", t_string},
    {"mapping", t_mapping},
    {"number", t_number},
    {"sequence", t_sequence},
    {"iterable", t_iterable},
    {"callable", t_callable},
    {"sameas", t_sameas},
    {"escaped", t_escaped},
    {"in", t_in},
    {"==", t_compare<ast::CompareOp::kEq>},
    {"eq", t_compare<ast::CompareOp::kEq>},
    {"equalto", t_compare<ast::CompareOp::kEq>},
    {"!=", t_compare<ast::CompareOp::kNe>},
    {"ne", t_compare<ast::CompareOp::kNe>},
    {">", t_compare<ast::CompareOp::kGt>},
    {"gt", t_compare<ast::CompareOp::kGt>},
    {"greaterthan", t_compare<ast::CompareOp::kGt>},
    {">=", t_compare<ast::CompareOp::kGe>},
    {"ge", t_compare<ast::CompareOp::kGe>},
    {"<", t_compare<ast::CompareOp::kLt>},
    {"lt", t_compare<ast::CompareOp::kLt>},
    {"lessthan", t_compare<ast::CompareOp::kLt>},
    {"<=", t_compare<ast::CompareOp::kLe>},
    {"le", t_compare<ast::CompareOp::kLe>},
};

}  // namespace

TestFn find_test(std::string_view name) {
  for (const Entry& e : kTests) {
    if (e.name == name) return e.fn;
  }
  return nullptr;
}

}  // namespace se::jinja
