// Value: the data model of the Jinja interpreter, mirroring the Python objects a jinja2 template
// sees (Undefined, None, bool, int, float, str, list, tuple, range, dict and its views, Namespace,
// generators, callables, the loop object). Containers are immutable and shared (copying a Value is
// cheap); namespaces, generators and the loop object hold mutable state with Python's reference
// semantics. A Value is used by one render at a time.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "base/status.h"

namespace se::jinja {

class Value;
class Dict;
class Callable;
class Interpreter;
struct Namespace;
struct IteratorState;
struct LoopState;

enum class ValueKind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kRange,     // range(start, stop, step); iterates like a tuple, prints as range(...)
  kDictView,  // dict.keys() / .values() / .items(): iterable, not indexable
  kDict,
  kNamespace,
  kIterator,  // a single-pass iterator or generator, e.g. the result of `|select` or `|reverse`
  kCallable,  // macros, global functions, bound methods
  kLoop,      // the `loop` object of a for loop
};

// Arguments of a call: positional values, then keyword arguments in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

class Value {
 public:
  Value() = default;  // undefined, with no hint
  // `hint` is the message of the error raised when the undefined value is misused (jinja2's
  // UndefinedError text, e.g. "'x' is undefined").
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  // `markup` marks jinja2 Markup strings (results of |safe and |escape), which escape what is
  // added.
  static Value string(std::string s, bool markup = false);
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  // Precondition: step != 0 and the length fits the caller's limit (items are materialized).
  static Value range(int64_t start, int64_t stop, int64_t step);
  enum class View { kKeys, kValues, kItems };
  static Value dict_view(const Dict& dict, View view);
  static Value dict(Dict d);
  // A plain iterator over `items`, e.g. reversed(list); `type_name` is its Python type.
  static Value iterator(std::vector<Value> items, std::string type_name);
  // A lazy generator: `produce` runs on each pull, like the body of a Python generator function.
  static Value generator(std::function<Result<std::optional<Value>>(Interpreter&)> produce,
                         std::string origin);
  static Value callable(std::shared_ptr<Callable> c);
  static Value namespace_object(std::shared_ptr<Namespace> ns);
  static Value loop(std::shared_ptr<LoopState> state);

  ValueKind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == ValueKind::kUndefined; }
  bool is_none() const { return kind_ == ValueKind::kNone; }
  bool is_string() const { return kind_ == ValueKind::kString; }
  bool is_markup() const { return kind_ == ValueKind::kString && markup_; }
  // bool, int or float (Python's numbers.Number).
  bool is_number() const {
    return kind_ == ValueKind::kBool || kind_ == ValueKind::kInt || kind_ == ValueKind::kFloat;
  }
  // bool or int (Python int, of which bool is a subclass).
  bool is_integral() const { return kind_ == ValueKind::kBool || kind_ == ValueKind::kInt; }
  bool is_sequence() const { return kind_ == ValueKind::kList || kind_ == ValueKind::kTuple; }
  // list, tuple or range: indexable with items().
  bool has_items() const { return is_sequence() || kind_ == ValueKind::kRange; }

  // Accessors; the precondition is the matching kind.
  bool as_bool() const { return std::get<int64_t>(payload_) != 0; }
  int64_t as_int() const { return std::get<int64_t>(payload_); }  // kBool or kInt
  double as_float() const;                                        // any number
  const std::string& as_string() const;                           // kString
  const std::vector<Value>& items() const;               // kList, kTuple, kRange or kDictView
  const Dict& as_dict() const;                           // kDict
  Namespace& as_namespace() const;                       // kNamespace
  IteratorState& as_iterator() const;                    // kIterator
  const std::shared_ptr<Callable>& as_callable() const;  // kCallable
  LoopState& as_loop() const;                            // kLoop
  const std::string& undefined_hint() const;             // kUndefined
  std::array<int64_t, 3> range_bounds() const;           // kRange: start, stop, step
  View dict_view_kind() const;                           // kDictView

  // Nesting depth of containers (0 for scalars); the interpreter bounds it.
  int depth() const { return depth_; }
  // Python truthiness (bool(x)).
  bool truthy() const;
  // Identity of shared objects, for the `sameas` test.
  const void* identity() const;

 private:
  struct RangeData;
  struct ViewData;
  using Payload =
      std::variant<std::monostate, int64_t, double, std::shared_ptr<const std::string>,
                   std::shared_ptr<const std::vector<Value>>, std::shared_ptr<const RangeData>,
                   std::shared_ptr<const ViewData>, std::shared_ptr<const Dict>,
                   std::shared_ptr<Namespace>, std::shared_ptr<IteratorState>,
                   std::shared_ptr<Callable>, std::shared_ptr<LoopState>>;

  ValueKind kind_ = ValueKind::kUndefined;
  bool markup_ = false;
  int depth_ = 0;
  Payload payload_;
};

// An insertion-ordered mapping with Python key semantics (1, 1.0 and True are the same key).
class Dict {
 public:
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Inserts, or replaces the value of an equal key in place (keeping its position, as Python does).
  void set(Value key, Value value);
  int depth() const { return depth_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::vector<std::pair<Value, Value>> items_;
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> string_index_;
  int depth_ = 0;
};

// The object made by namespace(): attributes assignable with {% set ns.attr = value %}.
struct Namespace {
  Dict attrs;
};

// A Python generator: yields `buffered` values from `pos` on, then what `produce` returns until it
// returns nullopt or fails. Single pass: consumed values are gone. Pull with generator_next().
struct IteratorState {
  std::vector<Value> buffered;
  size_t pos = 0;
  std::function<Result<std::optional<Value>>(Interpreter&)> produce;  // null once exhausted
  std::string type_name = "generator";  // Python type, e.g. "list_reverseiterator"
  std::string origin;                   // a generator's function name, for repr
};

// Something a template can call: a macro, a global function or a bound method.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual Result<Value> call(Interpreter& interp, CallArgs args) = 0;
  // Python-style repr, e.g. "<Macro 'name'>".
  virtual std::string repr() const = 0;
};

// Python equality (==): numbers compare by value across bool/int/float, containers element-wise,
// Undefined equals only Undefined.
bool py_equal(const Value& a, const Value& b);

}  // namespace se::jinja
