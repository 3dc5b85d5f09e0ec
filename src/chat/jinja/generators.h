// Python iteration for the interpreter: pulling from single-pass generators and iterating any
// value the way iter() would (list/tuple items, dict keys, string characters, generators, nothing
// for Undefined). Lazy filters (map, select, batch, ...) are built on these. One render's thread.
#pragma once

#include <optional>
#include <vector>

#include "base/status.h"
#include "chat/jinja/value.h"

namespace se::jinja {

class Interpreter;

// The next value of a generator, or nullopt when exhausted. An error ends the generator, as in
// Python.
Result<std::optional<Value>> generator_next(Interpreter& interp, IteratorState& it);

// A cursor like Python's iter(value).
class PyIterator {
 public:
  // Fails with TypeError for values Python cannot iterate (None, numbers, namespaces, ...).
  static Result<PyIterator> over(const Value& v);
  Result<std::optional<Value>> next(Interpreter& interp);

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
  Value generator_;  // set when iterating a generator
};

}  // namespace se::jinja
