// Post-parse validation of filter and test names, with jinja2's compile-time rule: an unknown name
// is a syntax error unless it sits in an if-statement or conditional expression ("soft" frames,
// which loops, macros and blocks nested inside them do not inherit), where it only fails if it
// runs.
#include "chat/jinja/builtins.h"
#include "chat/jinja/parser.h"

namespace se::jinja::detail {

Status Parser::check_args(ast::Args& args, bool soft) {
  for (ast::ExprPtr& e : args.positional) SE_RETURN_IF_ERROR(check_expr(e.get(), soft));
  for (auto& [name, e] : args.keyword) SE_RETURN_IF_ERROR(check_expr(e.get(), soft));
  return Status::ok();
}

// jinja2 rejects unknown filters/tests when compiling, except in the "soft" frames of if-statements
// and conditional expressions (but not in loops or macros nested there), where calling one fails.
Status Parser::check_expr(ast::Expr* expr, bool soft) {
  if (expr == nullptr) return Status::ok();
  auto fail = [&](const char* what, const std::string& name, bool unsupported) {
    std::string message = unsupported ? fmt::format("{} '{}' is not supported", what, name)
                                      : fmt::format("No {} named '{}'.", what, name);
    return invalid_argument("line {}, column {}: {}", expr->pos.line, expr->pos.column, message);
  };
  switch (expr->kind) {
    case ast::ExprKind::kLiteral:
    case ast::ExprKind::kName:
      return Status::ok();
    case ast::ExprKind::kList:
      for (auto& e : static_cast<ast::ListExpr*>(expr)->items) {
        SE_RETURN_IF_ERROR(check_expr(e.get(), soft));
      }
      return Status::ok();
    case ast::ExprKind::kDict:
      for (auto& [k, v] : static_cast<ast::DictExpr*>(expr)->items) {
        SE_RETURN_IF_ERROR(check_expr(k.get(), soft));
        SE_RETURN_IF_ERROR(check_expr(v.get(), soft));
      }
      return Status::ok();
    case ast::ExprKind::kGetAttr:
      return check_expr(static_cast<ast::GetAttrExpr*>(expr)->object.get(), soft);
    case ast::ExprKind::kGetItem: {
      auto* e = static_cast<ast::GetItemExpr*>(expr);
      SE_RETURN_IF_ERROR(check_expr(e->object.get(), soft));
      return check_expr(e->index.get(), soft);
    }
    case ast::ExprKind::kSlice: {
      auto* e = static_cast<ast::SliceExpr*>(expr);
      SE_RETURN_IF_ERROR(check_expr(e->start.get(), soft));
      SE_RETURN_IF_ERROR(check_expr(e->stop.get(), soft));
      return check_expr(e->step.get(), soft);
    }
    case ast::ExprKind::kCall: {
      auto* e = static_cast<ast::CallExpr*>(expr);
      SE_RETURN_IF_ERROR(check_expr(e->callee.get(), soft));
      return check_args(e->args, soft);
    }
    case ast::ExprKind::kFilter: {
      auto* e = static_cast<ast::FilterExpr*>(expr);
      if (find_filter(e->name) == nullptr) {
        if (!soft) return fail("filter", e->name, is_unsupported_jinja_filter(e->name));
        e->known = false;
      }
      SE_RETURN_IF_ERROR(check_expr(e->operand.get(), soft));
      return check_args(e->args, soft);
    }
    case ast::ExprKind::kTest: {
      auto* e = static_cast<ast::TestExpr*>(expr);
      if (find_test(e->name) == nullptr) {
        if (!soft) return fail("test", e->name, false);
        e->known = false;
      }
      SE_RETURN_IF_ERROR(check_expr(e->operand.get(), soft));
      return check_args(e->args, soft);
    }
    case ast::ExprKind::kNot:
    case ast::ExprKind::kNeg:
    case ast::ExprKind::kPos:
      return check_expr(static_cast<ast::UnaryExpr*>(expr)->operand.get(), soft);
    case ast::ExprKind::kBinary: {
      auto* e = static_cast<ast::BinaryExpr*>(expr);
      SE_RETURN_IF_ERROR(check_expr(e->lhs.get(), soft));
      return check_expr(e->rhs.get(), soft);
    }
    case ast::ExprKind::kAnd:
    case ast::ExprKind::kOr: {
      auto* e = static_cast<ast::LogicalExpr*>(expr);
      SE_RETURN_IF_ERROR(check_expr(e->lhs.get(), soft));
      return check_expr(e->rhs.get(), soft);
    }
    case ast::ExprKind::kConcat:
      for (auto& e : static_cast<ast::ConcatExpr*>(expr)->parts) {
        SE_RETURN_IF_ERROR(check_expr(e.get(), soft));
      }
      return Status::ok();
    case ast::ExprKind::kCompare: {
      auto* e = static_cast<ast::CompareExpr*>(expr);
      SE_RETURN_IF_ERROR(check_expr(e->first.get(), soft));
      for (auto& [op, rhs] : e->rest) SE_RETURN_IF_ERROR(check_expr(rhs.get(), soft));
      return Status::ok();
    }
    case ast::ExprKind::kCondition: {
      auto* e = static_cast<ast::ConditionExpr*>(expr);
      SE_RETURN_IF_ERROR(check_expr(e->test.get(), true));
      SE_RETURN_IF_ERROR(check_expr(e->then_expr.get(), true));
      return check_expr(e->else_expr.get(), true);
    }
  }
  return Status::ok();
}

Status Parser::check_names(ast::Body& body, bool soft) {
  for (ast::StmtPtr& stmt : body) {
    switch (stmt->kind) {
      case ast::StmtKind::kText:
      case ast::StmtKind::kBreak:
      case ast::StmtKind::kContinue:
        break;
      case ast::StmtKind::kOutput:
        SE_RETURN_IF_ERROR(check_expr(static_cast<ast::OutputStmt*>(stmt.get())->expr.get(), soft));
        break;
      case ast::StmtKind::kIf: {
        auto* s = static_cast<ast::IfStmt*>(stmt.get());
        for (auto& [test, branch] : s->branches) {
          SE_RETURN_IF_ERROR(check_expr(test.get(), true));
          SE_RETURN_IF_ERROR(check_names(branch, true));
        }
        SE_RETURN_IF_ERROR(check_names(s->else_body, true));
        break;
      }
      case ast::StmtKind::kFor: {
        auto* s = static_cast<ast::ForStmt*>(stmt.get());
        SE_RETURN_IF_ERROR(check_expr(s->iterable.get(), soft));
        SE_RETURN_IF_ERROR(check_expr(s->filter.get(), false));
        SE_RETURN_IF_ERROR(check_names(s->body, false));
        SE_RETURN_IF_ERROR(check_names(s->else_body, false));
        break;
      }
      case ast::StmtKind::kSet:
        SE_RETURN_IF_ERROR(check_expr(static_cast<ast::SetStmt*>(stmt.get())->value.get(), soft));
        break;
      case ast::StmtKind::kSetBlock: {
        auto* s = static_cast<ast::SetBlockStmt*>(stmt.get());
        SE_RETURN_IF_ERROR(check_expr(s->filter.get(), false));
        SE_RETURN_IF_ERROR(check_names(s->body, false));
        break;
      }
      case ast::StmtKind::kMacro: {
        auto& def = static_cast<ast::MacroStmt*>(stmt.get())->def;
        for (auto& d : def.defaults) SE_RETURN_IF_ERROR(check_expr(d.get(), false));
        SE_RETURN_IF_ERROR(check_names(def.body, false));
        break;
      }
      case ast::StmtKind::kCallBlock: {
        auto* s = static_cast<ast::CallBlockStmt*>(stmt.get());
        SE_RETURN_IF_ERROR(check_expr(s->call.get(), soft));
        for (auto& d : s->caller.defaults) SE_RETURN_IF_ERROR(check_expr(d.get(), false));
        SE_RETURN_IF_ERROR(check_names(s->caller.body, false));
        break;
      }
      case ast::StmtKind::kFilterBlock: {
        auto* s = static_cast<ast::FilterBlockStmt*>(stmt.get());
        SE_RETURN_IF_ERROR(check_expr(s->filter.get(), false));
        SE_RETURN_IF_ERROR(check_names(s->body, false));
        break;
      }
      case ast::StmtKind::kWith: {
        auto* s = static_cast<ast::WithStmt*>(stmt.get());
        for (auto& [target, value] : s->assignments) {
          SE_RETURN_IF_ERROR(check_expr(value.get(), soft));
        }
        SE_RETURN_IF_ERROR(check_names(s->body, false));
        break;
      }
      case ast::StmtKind::kScope:
        SE_RETURN_IF_ERROR(check_names(static_cast<ast::ScopeStmt*>(stmt.get())->body, soft));
        break;
    }
  }
  return Status::ok();
}

}  // namespace se::jinja::detail
