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
  std::vector<Value> items;  // after the loop's `if` filter
  size_t index0 = 0;
  int depth0 = 0;
  bool changed_called = false;
  std::vector<Value> last_changed;          // arguments of the previous loop.changed() call
  const ast::ForStmt* recursive = nullptr;  // set for `recursive` loops
  std::shared_ptr<Scope> scope;             // where a recursive loop re-runs its body
};

}  // namespace se::jinja
