// Python operator semantics for Values: arithmetic with int/float promotion and floor division,
// string and list repetition and concatenation, `str % args`, ordering comparisons,
// membership (`in`), slicing, and the errors Python and jinja2's Undefined raise. Pure functions
// apart from the size checks they ask of the Interpreter.
#pragma once

#include <optional>

#include "base/status.h"
#include "chat/jinja/ast.h"
#include "chat/jinja/value.h"

namespace se::jinja {

class Interpreter;

// jinja2's UndefinedError for a misused undefined value.
Status undefined_error(const Value& v);
// A Python TypeError/ValueError-style failure, e.g. type_error("unsupported operand ...").
Status type_error(const std::string& message);

Result<Value> binary_op(Interpreter& interp, ast::BinaryOp op, const Value& a, const Value& b);
Result<Value> unary_negate(const Value& v);
Result<Value> unary_plus(const Value& v);

// Python's a < b (numbers, strings, lists and tuples element-wise).
Result<bool> py_less(const Value& a, const Value& b);
Result<bool> compare_op(Interpreter& interp, ast::CompareOp op, const Value& a, const Value& b);
// Python's `item in container`.
Result<bool> py_contains(Interpreter& interp, const Value& container, const Value& item);

// obj[start:stop:step] for strings, lists and tuples; like the plain Python subscript jinja2
// compiles slices to, anything else raises (TypeError, or UndefinedError for undefined values).
Result<Value> slice_value(const Value& obj, const Value& start, const Value& stop,
                          const Value& step);

// An integer index from an int or bool, or nullopt.
std::optional<int64_t> as_index(const Value& v);

}  // namespace se::jinja
