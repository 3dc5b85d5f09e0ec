// LoopState: what the `loop` variable of a for loop reads (index, length, first/last,
// previtem/nextitem, cycle, changed) and, for `recursive` loops, what `loop(children)` re-enters.
// Owned by the loop's Value; lives for one render.
#pragma once

#include <memory>
#include <vector>

#include "chat/jinja/value.h"

namespace se::jinja {

namespace ast {
struct ForStmt;
}
class Scope;

struct LoopState {
  // Iterating a LoopContext yields (item, loop) for the items not reached yet and drains them.
  std::vector<Value> take_rest(const Value& self) {
    std::vector<Value> rest;
    if (!rest_consumed) {
      for (size_t i = index0 + 1; i < items.size(); ++i) {
        rest.push_back(Value::tuple({items[i], self}));
      }
      rest_consumed = true;
      // LoopContext.__next__ advances the loop's own index as the template drains it.
      if (!items.empty()) index0 = items.size() - 1;
    }
    return rest;
  }

  std::vector<Value> items;  // after the loop's `if` filter
  size_t index0 = 0;
  int depth0 = 0;
  bool changed_called = false;
  // Set when the template iterated the loop object itself (e.g. `x in loop`), which in jinja2
  // drains the loop's iterator: the current iteration is then the last one.
  bool rest_consumed = false;
  std::vector<Value> last_changed;          // arguments of the previous loop.changed() call
  const ast::ForStmt* recursive = nullptr;  // set for `recursive` loops
  std::shared_ptr<Scope> scope;             // where a recursive loop re-runs its body
};

}  // namespace se::jinja
