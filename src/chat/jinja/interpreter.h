// Interpreter: renders an ast::Program for one set of variables, with jinja2's scoping (for-loop
// bodies, macros, {% with %}, block sets and filter blocks are frames with their own variables; if
// blocks are not; frame locals assigned later start undefined, see scoping.h), Python value
// semantics, and hard limits on output size, work, recursion and nesting so that no template can
// hang, overflow the stack or exhaust memory. One Interpreter per render; not thread-safe, but many
// may share one Program.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "chat/jinja/ast.h"
#include "chat/jinja/value.h"

namespace se::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;  // also bounds any single string built
  uint64_t max_steps = 5'000'000;              // statements + expressions + loop iterations
  int max_call_depth = 100;                    // nested macro calls
  int max_eval_depth = 1000;  // nested statements + expressions across calls (~1 MB of stack)
  int max_nesting = 512;      // nesting depth of lists/dicts
};

// A variable scope; lookups fall back to the parent. Scopes hold a handful of names (loop bodies
// create one per iteration), so a flat vector beats a hash map.
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  // jinja2 frame locals assigned later in the frame: undefined until then (see scoping.h).
  void mark_undefined(const std::vector<std::string>& names);
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value value);
  void clear() { vars_.clear(); }

 private:
  std::shared_ptr<Scope> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};

class Interpreter {
 public:
  // `now` is the local time strftime_now() formats.
  Interpreter(const ast::Program& program, const RenderLimits& limits, std::tm now);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders with `variables` as the template's context. Errors: kInvalidArgument with "line N: ..."
  // (or exactly the message given to raise_exception), kResourceExhausted when a limit is hit.
  Result<std::string> render(const Dict& variables);

  // --- Services for filters, tests, methods and global functions. ---
  Result<Value> call(const Value& callee, CallArgs args);
  Result<Value> call_filter(std::string_view name, const Value& input, CallArgs args);
  Result<bool> call_test(std::string_view name, const Value& input, CallArgs args);
  // jinja2's environment getattr (attribute first, then item) and getitem (item first).
  Result<Value> get_attr(const Value& object, const std::string& name);
  Result<Value> get_item(const Value& object, const Value& key);
  // Python iteration: list/tuple items, dict keys, string characters, generator (consumed).
  Result<std::vector<Value>> iterate(const Value& v);
  // Fails when a string of `bytes` would exceed the output limit.
  Status check_string_size(size_t bytes) const;
  // Fails when the nesting of `v` exceeds the limit.
  Status check_nesting(const Value& v) const;
  Status count_step();
  const std::tm& now() const { return now_; }
  // Keeps a namespace or lazy generator for cleanup at the end of the render, which breaks any
  // reference cycle the template built through them. Returns `v`.
  Value track(Value v);
  // Marks the pending error as raised by the template itself (raise_exception): no location prefix.
  void mark_template_error() { template_error_ = true; }

  // Runs a macro body (or a call block's caller) with `args` bound to its parameters.
  Result<Value> call_macro(const ast::MacroDef& def, const std::shared_ptr<Scope>& closure,
                           CallArgs args, Value caller);
  // `loop(items)` inside a recursive for loop.
  Result<Value> call_loop(const Value& loop, CallArgs args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Statements (interpreter.cpp).
  Status exec_body(const ast::Body& body, const std::shared_ptr<Scope>& scope, std::string& out,
                   Flow* flow);
  Status exec(const ast::Stmt& stmt, const std::shared_ptr<Scope>& scope, std::string& out,
              Flow* flow);
  Status exec_if(const ast::IfStmt& stmt, const std::shared_ptr<Scope>& scope, std::string& out,
                 Flow* flow);
  Status exec_for(const ast::ForStmt& stmt, const std::shared_ptr<Scope>& scope, std::string& out,
                  const Value& items_value, int depth0);
  Status exec_set(const ast::SetStmt& stmt, const std::shared_ptr<Scope>& scope);
  Status exec_call_block(const ast::CallBlockStmt& stmt, const std::shared_ptr<Scope>& scope,
                         std::string& out);
  Status assign(const ast::Target& target, const Value& value, Scope& scope);
  Status append(std::string& out, std::string_view text);
  // Renders `body` in a new frame below `parent` whose `undefined_names` start undefined.
  Result<std::string> capture(const ast::Body& body, const std::shared_ptr<Scope>& parent,
                              const std::vector<std::string>& undefined_names);
  // Applies a FilterExpr chain whose innermost operand is null to `input`.
  Result<Value> apply_filter_chain(const ast::Expr& chain, Value input,
                                   const std::shared_ptr<Scope>& scope);
  std::shared_ptr<Scope> closure_scope(const std::shared_ptr<Scope>& scope);

  // Expressions (eval.cpp).
  Result<Value> eval(const ast::Expr& expr, const std::shared_ptr<Scope>& scope);
  Result<Value> eval_inner(const ast::Expr& expr, const std::shared_ptr<Scope>& scope);
  Result<CallArgs> eval_args(const ast::Args& args, const std::shared_ptr<Scope>& scope);
  Result<Value> eval_filter(const ast::FilterExpr& expr, const Value& input,
                            const std::shared_ptr<Scope>& scope);
  Result<Value> eval_compare(const ast::CompareExpr& expr, const std::shared_ptr<Scope>& scope);
  Result<Value> lookup(const std::string& name, const Scope& scope) const;
  // Bounds the C++ recursion of exec/eval (macro recursion multiplies statement nesting).
  Status enter_level();
  // Adds "line N: " to an error once, at the innermost node that failed.
  Status locate(Status status, const ast::SourcePos& pos);

  const ast::Program& program_;
  RenderLimits limits_;
  std::tm now_;
  uint64_t steps_ = 0;
  size_t output_bytes_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  bool located_ = false;
  bool template_error_ = false;
  // Scopes captured by macros; cleared at the end to break macro <-> scope reference cycles.
  std::vector<std::shared_ptr<Scope>> closure_scopes_;
  std::vector<Value> tracked_;  // namespaces and generators, emptied at the end for the same reason
};

}  // namespace se::jinja
