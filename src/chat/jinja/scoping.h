// jinja2 resolves variable names when it compiles a template, like Python: every frame (the
// template, a for-loop body or else branch, a macro or call-block body, {% with %}, block set,
// {% filter %}) owns the names it assigns. A name whose first mention in a frame is an
// unconditional assignment - not inside an if-branch, not loaded before, unknown to enclosing
// frames - is a local that starts undefined on each entry to the frame, hiding any context
// variable of that name until it is assigned (also for loops and macros nested in that frame).
// This pass records those names in the tree; the interpreter marks them undefined on frame entry.
#pragma once

#include "chat/jinja/ast.h"

namespace se::jinja {

// Fills the *_undefined / undefined_on_entry lists of `program` and all nested frames.
void resolve_frames(ast::Program& program);

}  // namespace se::jinja
