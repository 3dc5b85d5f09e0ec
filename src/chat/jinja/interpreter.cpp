// Statement execution: output, control flow, assignment, macros and call blocks.
#include "chat/jinja/interpreter.h"

#include "chat/jinja/builtins.h"
#include "chat/jinja/loop_state.h"
#include "chat/jinja/operators.h"
#include "chat/jinja/py_format.h"

namespace se::jinja {
namespace {

// A macro (or a call block's body) bound to the scope it was defined in.
class MacroCallable final : public Callable {
 public:
  MacroCallable(const ast::MacroDef& def, std::shared_ptr<Scope> closure)
      : def_(def), closure_(std::move(closure)) {}
  Result<Value> call(Interpreter& interp, CallArgs args) override {
    return interp.call_macro(def_, closure_, std::move(args), Value());
  }
  std::string repr() const override { return fmt::format("<Macro '{}'>", def_.name); }

 private:
  const ast::MacroDef& def_;
  std::shared_ptr<Scope> closure_;
};

}  // namespace

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_.get()) {
    for (const auto& [key, value] : s->vars_) {
      if (key == name) return &value;
    }
  }
  return nullptr;
}

void Scope::mark_undefined(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    set(name, Value::undefined(fmt::format("{} is undefined", py_repr_string(name))));
  }
}

void Scope::set(std::string_view name, Value value) {
  for (auto& [key, current] : vars_) {
    if (key == name) {
      current = std::move(value);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(value));
}

Interpreter::Interpreter(const ast::Program& program, const RenderLimits& limits, std::tm now)
    : program_(program), limits_(limits), now_(now) {}

Interpreter::~Interpreter() {
  for (const std::shared_ptr<Scope>& scope : closure_scopes_) scope->clear();
  for (const Value& v : tracked_) {
    if (v.kind() == ValueKind::kNamespace) v.as_namespace().attrs = Dict();
    if (v.kind() == ValueKind::kIterator) {
      v.as_iterator().produce = nullptr;
      v.as_iterator().buffered.clear();
    }
  }
}

Value Interpreter::track(Value v) {
  tracked_.push_back(v);
  return v;
}

Result<std::string> Interpreter::render(const Dict& variables) {
  auto root = std::make_shared<Scope>(nullptr);
  for (const auto& [key, value] : variables.items()) {
    if (key.is_string()) root->set(key.as_string(), value);
  }
  root->mark_undefined(program_.undefined_on_entry);
  std::string out;
  Flow flow = Flow::kNormal;
  SE_RETURN_IF_ERROR(exec_body(program_.body, root, out, &flow));
  return out;
}

Status Interpreter::count_step() {
  if (++steps_ > limits_.max_steps) {
    return resource_exhausted("template rendering exceeded {} steps (runaway loop?)",
                              limits_.max_steps);
  }
  return Status::ok();
}

Status Interpreter::enter_level() {
  if (++eval_depth_ > limits_.max_eval_depth) {
    return resource_exhausted("template evaluation nested deeper than {} levels",
                              limits_.max_eval_depth);
  }
  return Status::ok();
}

Status Interpreter::check_string_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    return resource_exhausted("template built a value larger than {} bytes",
                              limits_.max_output_bytes);
  }
  return Status::ok();
}

Status Interpreter::check_nesting(const Value& v) const {
  if (v.depth() > limits_.max_nesting) {
    return resource_exhausted("template built a value nested deeper than {} levels",
                              limits_.max_nesting);
  }
  return Status::ok();
}

Status Interpreter::locate(Status status, const ast::SourcePos& pos) {
  if (status.is_ok() || located_) return status;
  located_ = true;
  if (template_error_) return status;
  return Status(status.code(), fmt::format("line {}: {}", pos.line, status.message()));
}

Status Interpreter::append(std::string& out, std::string_view text) {
  output_bytes_ += text.size();
  if (output_bytes_ > limits_.max_output_bytes) {
    return resource_exhausted("template output exceeded {} bytes", limits_.max_output_bytes);
  }
  out.append(text);
  return Status::ok();
}

std::shared_ptr<Scope> Interpreter::closure_scope(const std::shared_ptr<Scope>& scope) {
  if (closure_scopes_.empty() || closure_scopes_.back() != scope) closure_scopes_.push_back(scope);
  return scope;
}

Status Interpreter::exec_body(const ast::Body& body, const std::shared_ptr<Scope>& scope,
                              std::string& out, Flow* flow) {
  for (const ast::StmtPtr& stmt : body) {
    SE_RETURN_IF_ERROR(exec(*stmt, scope, out, flow));
    if (*flow != Flow::kNormal) return Status::ok();
  }
  return Status::ok();
}

Result<std::string> Interpreter::capture(const ast::Body& body,
                                         const std::shared_ptr<Scope>& parent,
                                         const std::vector<std::string>& undefined_names) {
  auto scope = std::make_shared<Scope>(parent);
  scope->mark_undefined(undefined_names);
  std::string out;
  Flow flow = Flow::kNormal;
  SE_RETURN_IF_ERROR(exec_body(body, scope, out, &flow));
  return out;
}

Status Interpreter::exec(const ast::Stmt& stmt, const std::shared_ptr<Scope>& scope,
                         std::string& out, Flow* flow) {
  struct LevelExit {
    int& depth;
    ~LevelExit() { --depth; }
  } level_exit{eval_depth_};
  SE_RETURN_IF_ERROR(locate(enter_level(), stmt.pos));
  SE_RETURN_IF_ERROR(locate(count_step(), stmt.pos));
  Status status;
  switch (stmt.kind) {
    case ast::StmtKind::kText:
      status = append(out, static_cast<const ast::TextStmt&>(stmt).text);
      break;
    case ast::StmtKind::kOutput: {
      SE_ASSIGN_OR_RETURN(Value v, eval(*static_cast<const ast::OutputStmt&>(stmt).expr, scope));
      status = append(out, py_str(v));
      break;
    }
    case ast::StmtKind::kIf:
      status = exec_if(static_cast<const ast::IfStmt&>(stmt), scope, out, flow);
      break;
    case ast::StmtKind::kFor: {
      const auto& s = static_cast<const ast::ForStmt&>(stmt);
      SE_ASSIGN_OR_RETURN(Value items, eval(*s.iterable, scope));
      status = exec_for(s, scope, out, items, 0);
      break;
    }
    case ast::StmtKind::kSet:
      status = exec_set(static_cast<const ast::SetStmt&>(stmt), scope);
      break;
    case ast::StmtKind::kSetBlock: {
      const auto& s = static_cast<const ast::SetBlockStmt&>(stmt);
      SE_ASSIGN_OR_RETURN(std::string text, capture(s.body, scope, s.undefined_on_entry));
      Value value = Value::string(std::move(text));
      if (s.filter) {
        SE_ASSIGN_OR_RETURN(value, apply_filter_chain(*s.filter, std::move(value), scope));
      }
      status = assign(s.target, value, *scope);
      break;
    }
    case ast::StmtKind::kMacro: {
      const auto& s = static_cast<const ast::MacroStmt&>(stmt);
      scope->set(s.def.name,
                 Value::callable(std::make_shared<MacroCallable>(s.def, closure_scope(scope))));
      break;
    }
    case ast::StmtKind::kCallBlock:
      status = exec_call_block(static_cast<const ast::CallBlockStmt&>(stmt), scope, out);
      break;
    case ast::StmtKind::kFilterBlock: {
      const auto& s = static_cast<const ast::FilterBlockStmt&>(stmt);
      SE_ASSIGN_OR_RETURN(std::string text, capture(s.body, scope, s.undefined_on_entry));
      SE_ASSIGN_OR_RETURN(Value v,
                          apply_filter_chain(*s.filter, Value::string(std::move(text)), scope));
      status = append(out, py_str(v));
      break;
    }
    case ast::StmtKind::kWith: {
      const auto& s = static_cast<const ast::WithStmt&>(stmt);
      auto inner = std::make_shared<Scope>(scope);
      inner->mark_undefined(s.undefined_on_entry);
      for (const auto& [target, value_expr] : s.assignments) {
        SE_ASSIGN_OR_RETURN(Value v, eval(*value_expr, scope));
        SE_RETURN_IF_ERROR(locate(assign(target, v, *inner), target.pos));
      }
      Flow inner_flow = Flow::kNormal;
      status = exec_body(s.body, inner, out, &inner_flow);
      break;
    }
    case ast::StmtKind::kBreak:
      *flow = Flow::kBreak;
      break;
    case ast::StmtKind::kContinue:
      *flow = Flow::kContinue;
      break;
    case ast::StmtKind::kScope: {
      const auto& s = static_cast<const ast::ScopeStmt&>(stmt);
      if (!s.new_frame) {
        status = exec_body(s.body, scope, out, flow);
        break;
      }
      auto inner = std::make_shared<Scope>(scope);
      inner->mark_undefined(s.undefined_on_entry);
      status = exec_body(s.body, inner, out, flow);
      break;
    }
  }
  return locate(std::move(status), stmt.pos);
}

Status Interpreter::exec_if(const ast::IfStmt& stmt, const std::shared_ptr<Scope>& scope,
                            std::string& out, Flow* flow) {
  for (const auto& [test, body] : stmt.branches) {
    SE_ASSIGN_OR_RETURN(Value v, eval(*test, scope));
    if (v.truthy()) return exec_body(body, scope, out, flow);
  }
  return exec_body(stmt.else_body, scope, out, flow);
}

Status Interpreter::exec_for(const ast::ForStmt& stmt, const std::shared_ptr<Scope>& scope,
                             std::string& out, const Value& items_value, int depth0) {
  SE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(items_value));
  if (stmt.filter) {
    std::vector<Value> kept;
    for (Value& item : items) {
      SE_RETURN_IF_ERROR(count_step());
      auto test_scope = std::make_shared<Scope>(scope);
      SE_RETURN_IF_ERROR(locate(assign(stmt.target, item, *test_scope), stmt.pos));
      SE_ASSIGN_OR_RETURN(Value keep, eval(*stmt.filter, test_scope));
      if (keep.truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  auto state = std::make_shared<LoopState>();
  state->items = std::move(items);
  state->depth0 = depth0;
  if (stmt.recursive) {
    state->recursive = &stmt;
    state->scope = closure_scope(scope);
  }
  Value loop = Value::loop(state);
  // Like jinja2, the else branch runs unless some iteration reached the end of the body.
  bool completed_iteration = false;
  for (size_t i = 0; i < state->items.size(); ++i) {
    SE_RETURN_IF_ERROR(locate(count_step(), stmt.pos));
    state->index0 = i;
    auto body_scope = std::make_shared<Scope>(scope);
    SE_RETURN_IF_ERROR(locate(assign(stmt.target, state->items[i], *body_scope), stmt.pos));
    body_scope->set("loop", loop);
    body_scope->mark_undefined(stmt.body_undefined);
    Flow flow = Flow::kNormal;
    SE_RETURN_IF_ERROR(exec_body(stmt.body, body_scope, out, &flow));
    if (flow == Flow::kBreak) break;
    if (flow == Flow::kNormal) completed_iteration = true;
    if (state->rest_consumed) break;
  }
  if (!completed_iteration && !stmt.else_body.empty()) {
    auto else_scope = std::make_shared<Scope>(scope);
    else_scope->mark_undefined(stmt.else_undefined);
    Flow flow = Flow::kNormal;
    SE_RETURN_IF_ERROR(exec_body(stmt.else_body, else_scope, out, &flow));
  }
  return Status::ok();
}

Result<Value> Interpreter::call_loop(const Value& loop, CallArgs args) {
  LoopState& state = loop.as_loop();
  if (state.recursive == nullptr) {
    return type_error("The loop must have the 'recursive' marker to be called recursively.");
  }
  if (args.positional.size() != 1 || !args.keyword.empty()) {
    return type_error("loop() takes exactly one argument");
  }
  if (++call_depth_ > limits_.max_call_depth) {
    --call_depth_;
    return resource_exhausted("recursive loop nested deeper than {} levels",
                              limits_.max_call_depth);
  }
  std::string out;
  Status status =
      exec_for(*state.recursive, state.scope, out, args.positional[0], state.depth0 + 1);
  --call_depth_;
  SE_RETURN_IF_ERROR(status);
  return Value::string(std::move(out));
}

Status Interpreter::exec_set(const ast::SetStmt& stmt, const std::shared_ptr<Scope>& scope) {
  SE_ASSIGN_OR_RETURN(Value v, eval(*stmt.value, scope));
  return assign(stmt.target, v, *scope);
}

Status Interpreter::assign(const ast::Target& target, const Value& value, Scope& scope) {
  switch (target.kind) {
    case ast::Target::Kind::kName:
      SE_RETURN_IF_ERROR(check_nesting(value));
      scope.set(target.name, value);
      return Status::ok();
    case ast::Target::Kind::kTuple: {
      SE_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(value));
      size_t n = target.items.size();
      if (items.size() < n) {
        return invalid_argument("ValueError: not enough values to unpack (expected {}, got {})", n,
                                items.size());
      }
      if (items.size() > n) {
        return invalid_argument("ValueError: too many values to unpack (expected {})", n);
      }
      for (size_t i = 0; i < n; ++i) SE_RETURN_IF_ERROR(assign(target.items[i], items[i], scope));
      return Status::ok();
    }
    case ast::Target::Kind::kNamespaceAttr: {
      const Value* ns = scope.find(target.name);
      if (ns == nullptr || ns->kind() != ValueKind::kNamespace) {
        return invalid_argument(
            "TemplateRuntimeError: cannot assign attribute on non-namespace object");
      }
      if (!target.attr.empty() && target.attr[0] == '_') {
        return invalid_argument(
            "SecurityError: Chat templates cannot store underscore-prefixed attributes on a "
            "namespace, but got {}. Please rename the attribute.",
            py_repr_string(target.attr));
      }
      SE_RETURN_IF_ERROR(check_nesting(value));
      ns->as_namespace().attrs.set(Value::string(target.attr), value);
      return Status::ok();
    }
  }
  return Status::ok();
}

Status Interpreter::exec_call_block(const ast::CallBlockStmt& stmt,
                                    const std::shared_ptr<Scope>& scope, std::string& out) {
  const auto& call_expr = static_cast<const ast::CallExpr&>(*stmt.call);
  SE_ASSIGN_OR_RETURN(Value callee, eval(*call_expr.callee, scope));
  SE_ASSIGN_OR_RETURN(CallArgs args, eval_args(call_expr.args, scope));
  args.keyword.emplace_back("caller", Value::callable(std::make_shared<MacroCallable>(
                                          stmt.caller, closure_scope(scope))));
  SE_ASSIGN_OR_RETURN(Value result, call(callee, std::move(args)));
  return append(out, py_str(result));
}

// jinja2's Macro.__call__: positional arguments fill parameters first, keywords fill the rest;
// extras go to varargs/kwargs when the body uses them; missing parameters take their default or
// become undefined.
Result<Value> Interpreter::call_macro(const ast::MacroDef& def,
                                      const std::shared_ptr<Scope>& closure, CallArgs args,
                                      Value caller) {
  auto scope = std::make_shared<Scope>(closure);
  const size_t num_params = def.params.size();
  const size_t num_positional = std::min(args.positional.size(), num_params);
  std::vector<bool> bound(num_params, false);
  for (size_t i = 0; i < num_positional; ++i) {
    scope->set(def.params[i], args.positional[i]);
    bound[i] = true;
  }
  Dict extra_kwargs;
  bool found_caller = false;
  for (auto& [key, value] : args.keyword) {
    auto it = std::find(def.params.begin() + static_cast<ptrdiff_t>(num_positional),
                        def.params.end(), key);
    if (it != def.params.end() && !bound[it - def.params.begin()]) {
      scope->set(key, value);
      bound[it - def.params.begin()] = true;
    } else if (key == "caller" && def.uses_caller && !found_caller) {
      caller = value;
      found_caller = true;
    } else if (def.uses_kwargs) {
      extra_kwargs.set(Value::string(key), value);
    } else {
      return type_error(fmt::format("macro {} takes no keyword argument {}",
                                    py_repr_string(def.name), py_repr_string(key)));
    }
  }
  if (args.positional.size() > num_params && !def.uses_varargs) {
    return type_error(fmt::format("macro {} takes not more than {} argument(s)",
                                  py_repr_string(def.name), num_params));
  }
  if (++call_depth_ > limits_.max_call_depth) {
    --call_depth_;
    return resource_exhausted("macro calls nested deeper than {} levels", limits_.max_call_depth);
  }
  struct DepthRestore {
    int& depth;
    ~DepthRestore() { --depth; }
  } restore{call_depth_};
  const size_t first_default = num_params - def.defaults.size();
  for (size_t i = 0; i < num_params; ++i) {
    if (bound[i]) continue;
    if (i >= first_default) {
      SE_ASSIGN_OR_RETURN(Value d, eval(*def.defaults[i - first_default], scope));
      scope->set(def.params[i], std::move(d));
    } else {
      scope->set(def.params[i], Value::undefined(fmt::format("parameter {} was not provided",
                                                             py_repr_string(def.params[i]))));
    }
  }
  if (def.uses_varargs) {
    std::vector<Value> rest;
    if (args.positional.size() > num_params) {
      rest.assign(args.positional.begin() + static_cast<ptrdiff_t>(num_params),
                  args.positional.end());
    }
    scope->set("varargs", Value::tuple(std::move(rest)));
  }
  if (def.uses_kwargs) scope->set("kwargs", Value::dict(std::move(extra_kwargs)));
  if (def.uses_caller) {
    scope->set("caller", caller.is_undefined() ? Value::undefined("No caller defined") : caller);
  }
  scope->mark_undefined(def.undefined_on_entry);
  std::string out;
  Flow flow = Flow::kNormal;
  SE_RETURN_IF_ERROR(exec_body(def.body, scope, out, &flow));
  return Value::string(std::move(out));
}

Result<Value> Interpreter::apply_filter_chain(const ast::Expr& chain, Value input,
                                              const std::shared_ptr<Scope>& scope) {
  const auto& filter = static_cast<const ast::FilterExpr&>(chain);
  if (filter.operand) {
    SE_ASSIGN_OR_RETURN(input, apply_filter_chain(*filter.operand, std::move(input), scope));
  }
  return eval_filter(filter, std::move(input), scope);
}

}  // namespace se::jinja
