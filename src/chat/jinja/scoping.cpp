// Mirrors jinja2's idtracking: a Symbols table per frame, filled in source order, with if-branches
// analysed on copies and merged (a name assigned in a branch resolves from outside instead of
// starting undefined).
#include "chat/jinja/scoping.h"

#include <map>
#include <set>

namespace se::jinja {
namespace {

enum class Mode { kParam, kResolve, kAlias, kUndefined };

struct Symbols {
  const Symbols* parent = nullptr;
  std::map<std::string, Mode> refs;
  std::set<std::string> stores;

  bool find_ref(const std::string& name) const {
    for (const Symbols* s = this; s != nullptr; s = s->parent) {
      if (s->refs.count(name) != 0) return true;
    }
    return false;
  }
  void load(const std::string& name) {
    if (!find_ref(name)) refs[name] = Mode::kResolve;
  }
  void store(const std::string& name) {
    stores.insert(name);
    if (refs.count(name) == 0) {
      refs[name] = (parent != nullptr && parent->find_ref(name)) ? Mode::kAlias : Mode::kUndefined;
    }
  }
  void param(const std::string& name) {
    stores.insert(name);
    refs[name] = Mode::kParam;
  }
  // Merges if-branch tables: names first assigned inside a branch resolve from outside.
  void branch_update(const std::vector<Symbols>& branches) {
    std::set<std::string> new_stores;
    for (const Symbols& b : branches) new_stores.insert(b.stores.begin(), b.stores.end());
    for (const std::string& s : stores) new_stores.erase(s);
    for (const Symbols& b : branches) {
      for (const auto& [name, mode] : b.refs) refs[name] = mode;
      stores.insert(b.stores.begin(), b.stores.end());
    }
    for (const std::string& name : new_stores) {
      refs[name] = (parent != nullptr && parent->find_ref(name)) ? Mode::kAlias : Mode::kResolve;
    }
  }
  std::vector<std::string> undefined_names() const {
    std::vector<std::string> out;
    for (const auto& [name, mode] : refs) {
      if (mode == Mode::kUndefined) out.push_back(name);
    }
    return out;
  }
};

void visit_expr(const ast::Expr* expr, Symbols& sym);

void visit_args(const ast::Args& args, Symbols& sym) {
  for (const ast::ExprPtr& e : args.positional) visit_expr(e.get(), sym);
  for (const auto& [name, e] : args.keyword) visit_expr(e.get(), sym);
}

void visit_expr(const ast::Expr* expr, Symbols& sym) {
  if (expr == nullptr) return;
  switch (expr->kind) {
    case ast::ExprKind::kLiteral:
      return;
    case ast::ExprKind::kName:
      sym.load(static_cast<const ast::NameExpr*>(expr)->name);
      return;
    case ast::ExprKind::kList:
      for (const auto& e : static_cast<const ast::ListExpr*>(expr)->items) visit_expr(e.get(), sym);
      return;
    case ast::ExprKind::kDict:
      for (const auto& [k, v] : static_cast<const ast::DictExpr*>(expr)->items) {
        visit_expr(k.get(), sym);
        visit_expr(v.get(), sym);
      }
      return;
    case ast::ExprKind::kGetAttr:
      visit_expr(static_cast<const ast::GetAttrExpr*>(expr)->object.get(), sym);
      return;
    case ast::ExprKind::kGetItem: {
      const auto* e = static_cast<const ast::GetItemExpr*>(expr);
      visit_expr(e->object.get(), sym);
      visit_expr(e->index.get(), sym);
      return;
    }
    case ast::ExprKind::kSlice: {
      const auto* e = static_cast<const ast::SliceExpr*>(expr);
      visit_expr(e->start.get(), sym);
      visit_expr(e->stop.get(), sym);
      visit_expr(e->step.get(), sym);
      return;
    }
    case ast::ExprKind::kCall: {
      const auto* e = static_cast<const ast::CallExpr*>(expr);
      visit_expr(e->callee.get(), sym);
      visit_args(e->args, sym);
      return;
    }
    case ast::ExprKind::kFilter: {
      const auto* e = static_cast<const ast::FilterExpr*>(expr);
      visit_expr(e->operand.get(), sym);
      visit_args(e->args, sym);
      return;
    }
    case ast::ExprKind::kTest: {
      const auto* e = static_cast<const ast::TestExpr*>(expr);
      visit_expr(e->operand.get(), sym);
      visit_args(e->args, sym);
      return;
    }
    case ast::ExprKind::kNot:
    case ast::ExprKind::kNeg:
    case ast::ExprKind::kPos:
      visit_expr(static_cast<const ast::UnaryExpr*>(expr)->operand.get(), sym);
      return;
    case ast::ExprKind::kBinary: {
      const auto* e = static_cast<const ast::BinaryExpr*>(expr);
      visit_expr(e->lhs.get(), sym);
      visit_expr(e->rhs.get(), sym);
      return;
    }
    case ast::ExprKind::kAnd:
    case ast::ExprKind::kOr: {
      const auto* e = static_cast<const ast::LogicalExpr*>(expr);
      visit_expr(e->lhs.get(), sym);
      visit_expr(e->rhs.get(), sym);
      return;
    }
    case ast::ExprKind::kConcat:
      for (const auto& e : static_cast<const ast::ConcatExpr*>(expr)->parts) {
        visit_expr(e.get(), sym);
      }
      return;
    case ast::ExprKind::kCompare: {
      const auto* e = static_cast<const ast::CompareExpr*>(expr);
      visit_expr(e->first.get(), sym);
      for (const auto& [op, rhs] : e->rest) visit_expr(rhs.get(), sym);
      return;
    }
    case ast::ExprKind::kCondition: {
      const auto* e = static_cast<const ast::ConditionExpr*>(expr);
      visit_expr(e->test.get(), sym);
      visit_expr(e->then_expr.get(), sym);
      visit_expr(e->else_expr.get(), sym);
      return;
    }
  }
}

void store_target(const ast::Target& target, Symbols& sym, bool as_param) {
  switch (target.kind) {
    case ast::Target::Kind::kName:
      as_param ? sym.param(target.name) : sym.store(target.name);
      return;
    case ast::Target::Kind::kNamespaceAttr:
      sym.load(target.name);
      return;
    case ast::Target::Kind::kTuple:
      for (const ast::Target& t : target.items) store_target(t, sym, as_param);
      return;
  }
}

void visit_body(const ast::Body& body, Symbols& sym);

// An if/elif/else chain from branch `index` on; jinja2 nests each elif as an If node.
void visit_if(const ast::IfStmt& stmt, size_t index, Symbols& sym) {
  visit_expr(stmt.branches[index].first.get(), sym);
  Symbols body = sym;
  visit_body(stmt.branches[index].second, body);
  Symbols elifs = sym;
  if (index + 1 < stmt.branches.size()) visit_if(stmt, index + 1, elifs);
  Symbols otherwise = sym;
  if (index == 0) visit_body(stmt.else_body, otherwise);
  sym.branch_update({body, elifs, otherwise});
}

// One statement, as jinja2's FrameSymbolVisitor sees it from the enclosing frame.
void visit_stmt(const ast::Stmt& stmt, Symbols& sym) {
  switch (stmt.kind) {
    case ast::StmtKind::kText:
    case ast::StmtKind::kBreak:
    case ast::StmtKind::kContinue:
      return;
    case ast::StmtKind::kOutput:
      visit_expr(static_cast<const ast::OutputStmt&>(stmt).expr.get(), sym);
      return;
    case ast::StmtKind::kIf:
      visit_if(static_cast<const ast::IfStmt&>(stmt), 0, sym);
      return;
    case ast::StmtKind::kFor:
      visit_expr(static_cast<const ast::ForStmt&>(stmt).iterable.get(), sym);
      return;
    case ast::StmtKind::kSet: {
      const auto& s = static_cast<const ast::SetStmt&>(stmt);
      visit_expr(s.value.get(), sym);
      store_target(s.target, sym, false);
      return;
    }
    case ast::StmtKind::kSetBlock:
      store_target(static_cast<const ast::SetBlockStmt&>(stmt).target, sym, false);
      return;
    case ast::StmtKind::kMacro:
      sym.store(static_cast<const ast::MacroStmt&>(stmt).def.name);
      return;
    case ast::StmtKind::kCallBlock:
      visit_expr(static_cast<const ast::CallBlockStmt&>(stmt).call.get(), sym);
      return;
    case ast::StmtKind::kFilterBlock:
      visit_expr(static_cast<const ast::FilterBlockStmt&>(stmt).filter.get(), sym);
      return;
    case ast::StmtKind::kWith:
      for (const auto& [target, value] : static_cast<const ast::WithStmt&>(stmt).assignments) {
        visit_expr(value.get(), sym);
      }
      return;
    case ast::StmtKind::kScope: {
      const auto& s = static_cast<const ast::ScopeStmt&>(stmt);
      if (!s.new_frame) visit_body(s.body, sym);
      return;
    }
  }
}

void visit_body(const ast::Body& body, Symbols& sym) {
  for (const ast::StmtPtr& stmt : body) visit_stmt(*stmt, sym);
}

void resolve_children(ast::Body& body, const Symbols& frame);

// Analyses a macro or call-block body as its own frame.
void resolve_macro(ast::MacroDef& def, const Symbols& parent) {
  Symbols sym;
  sym.parent = &parent;
  for (const std::string& p : def.params) sym.param(p);
  for (const char* special : {"caller", "varargs", "kwargs"}) sym.param(special);
  for (const ast::ExprPtr& d : def.defaults) visit_expr(d.get(), sym);
  visit_body(def.body, sym);
  def.undefined_on_entry = sym.undefined_names();
  resolve_children(def.body, sym);
}

// A frame whose table is just its body (block set, filter block, generation scope).
std::vector<std::string> resolve_body_frame(ast::Body& body, const Symbols& parent) {
  Symbols sym;
  sym.parent = &parent;
  visit_body(body, sym);
  resolve_children(body, sym);
  return sym.undefined_names();
}

// Finds the frames nested directly in `body` (looking inside if-branches, which share the
// frame) and analyses each with `frame` as the enclosing table.
void resolve_children(ast::Body& body, const Symbols& frame) {
  for (ast::StmtPtr& stmt : body) {
    switch (stmt->kind) {
      case ast::StmtKind::kIf: {
        auto& s = static_cast<ast::IfStmt&>(*stmt);
        for (auto& [test, branch] : s.branches) resolve_children(branch, frame);
        resolve_children(s.else_body, frame);
        break;
      }
      case ast::StmtKind::kFor: {
        auto& s = static_cast<ast::ForStmt&>(*stmt);
        Symbols loop_body;
        loop_body.parent = &frame;
        loop_body.param("loop");
        store_target(s.target, loop_body, true);
        visit_body(s.body, loop_body);
        s.body_undefined = loop_body.undefined_names();
        resolve_children(s.body, loop_body);
        Symbols else_body;
        else_body.parent = &frame;
        visit_body(s.else_body, else_body);
        s.else_undefined = else_body.undefined_names();
        resolve_children(s.else_body, else_body);
        break;
      }
      case ast::StmtKind::kMacro:
        resolve_macro(static_cast<ast::MacroStmt&>(*stmt).def, frame);
        break;
      case ast::StmtKind::kCallBlock:
        resolve_macro(static_cast<ast::CallBlockStmt&>(*stmt).caller, frame);
        break;
      case ast::StmtKind::kSetBlock: {
        auto& s = static_cast<ast::SetBlockStmt&>(*stmt);
        s.undefined_on_entry = resolve_body_frame(s.body, frame);
        break;
      }
      case ast::StmtKind::kFilterBlock: {
        auto& s = static_cast<ast::FilterBlockStmt&>(*stmt);
        s.undefined_on_entry = resolve_body_frame(s.body, frame);
        break;
      }
      case ast::StmtKind::kWith: {
        auto& s = static_cast<ast::WithStmt&>(*stmt);
        Symbols sym;
        sym.parent = &frame;
        for (const auto& [target, value] : s.assignments) store_target(target, sym, true);
        visit_body(s.body, sym);
        s.undefined_on_entry = sym.undefined_names();
        resolve_children(s.body, sym);
        break;
      }
      case ast::StmtKind::kScope: {
        auto& s = static_cast<ast::ScopeStmt&>(*stmt);
        if (s.new_frame) s.undefined_on_entry = resolve_body_frame(s.body, frame);
        break;
      }
      default:
        break;
    }
  }
}

}  // namespace

void resolve_frames(ast::Program& program) {
  Symbols root;
  visit_body(program.body, root);
  program.undefined_on_entry = root.undefined_names();
  resolve_children(program.body, root);
}

}  // namespace se::jinja
