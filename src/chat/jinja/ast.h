// The syntax tree of a parsed template: expressions (Expr) and statements (Stmt). Built once by the
// parser, then only read; a tree is shared by every render of its Template (read-only, so
// thread-safe).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace se::jinja::ast {

struct SourcePos {
  int line = 1;
  int column = 1;
};

enum class ExprKind {
  kLiteral,
  kName,
  kList,  // also tuples
  kDict,
  kGetAttr,
  kGetItem,
  kSlice,  // only as the index of kGetItem
  kCall,
  kFilter,
  kTest,
  kNot,
  kNeg,
  kPos,
  kBinary,
  kAnd,
  kOr,
  kConcat,
  kCompare,
  kCondition,
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr {
  Expr(ExprKind k, SourcePos p) : kind(k), pos(p) {}
  virtual ~Expr() = default;
  ExprKind kind;
  SourcePos pos;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Args {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct LiteralExpr : Expr {
  LiteralExpr(SourcePos p, Value v) : Expr(ExprKind::kLiteral, p), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(SourcePos p, std::string n) : Expr(ExprKind::kName, p), name(std::move(n)) {}
  std::string name;
};

struct ListExpr : Expr {
  ListExpr(SourcePos p, bool tuple) : Expr(ExprKind::kList, p), is_tuple(tuple) {}
  bool is_tuple;
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(SourcePos p) : Expr(ExprKind::kDict, p) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(SourcePos p, ExprPtr o, std::string n)
      : Expr(ExprKind::kGetAttr, p), object(std::move(o)), name(std::move(n)) {}
  ExprPtr object;
  std::string name;
};

struct GetItemExpr : Expr {
  GetItemExpr(SourcePos p, ExprPtr o, ExprPtr i)
      : Expr(ExprKind::kGetItem, p), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;
};

struct SliceExpr : Expr {
  explicit SliceExpr(SourcePos p) : Expr(ExprKind::kSlice, p) {}
  ExprPtr start, stop, step;  // each may be null
};

struct CallExpr : Expr {
  CallExpr(SourcePos p, ExprPtr c) : Expr(ExprKind::kCall, p), callee(std::move(c)) {}
  ExprPtr callee;
  Args args;
};

// `operand | name(args)`; operand is null inside {% filter %} and {% set x | f %} blocks.
// `known` is false for a name jinja2 does not define, kept only where jinja2 defers the error to
// run time (inside if-statements and conditional expressions).
struct FilterExpr : Expr {
  FilterExpr(SourcePos p, ExprPtr o, std::string n)
      : Expr(ExprKind::kFilter, p), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  Args args;
  bool known = true;
};

struct TestExpr : Expr {
  TestExpr(SourcePos p, ExprPtr o, std::string n)
      : Expr(ExprKind::kTest, p), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;
  std::string name;
  Args args;
  bool known = true;
};

// kNot, kNeg, kPos.
struct UnaryExpr : Expr {
  UnaryExpr(ExprKind k, SourcePos p, ExprPtr o) : Expr(k, p), operand(std::move(o)) {}
  ExprPtr operand;
};

struct BinaryExpr : Expr {
  BinaryExpr(SourcePos p, BinaryOp o, ExprPtr l, ExprPtr r)
      : Expr(ExprKind::kBinary, p), op(o), lhs(std::move(l)), rhs(std::move(r)) {}
  BinaryOp op;
  ExprPtr lhs, rhs;
};

// kAnd, kOr: short-circuit, yielding an operand like Python.
struct LogicalExpr : Expr {
  LogicalExpr(ExprKind k, SourcePos p, ExprPtr l, ExprPtr r)
      : Expr(k, p), lhs(std::move(l)), rhs(std::move(r)) {}
  ExprPtr lhs, rhs;
};

struct ConcatExpr : Expr {
  explicit ConcatExpr(SourcePos p) : Expr(ExprKind::kConcat, p) {}
  std::vector<ExprPtr> parts;
};

// `first op1 e1 op2 e2 ...`, chained like Python.
struct CompareExpr : Expr {
  CompareExpr(SourcePos p, ExprPtr f) : Expr(ExprKind::kCompare, p), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

// `then_expr if test else else_expr`; else_expr may be null.
struct ConditionExpr : Expr {
  ConditionExpr(SourcePos p, ExprPtr t, ExprPtr th, ExprPtr el)
      : Expr(ExprKind::kCondition, p),
        test(std::move(t)),
        then_expr(std::move(th)),
        else_expr(std::move(el)) {}
  ExprPtr test, then_expr, else_expr;
};

// Assignment targets of for/set/with: a name, a tuple of targets, or `ns.attr` (set only).
struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttr } kind = Kind::kName;
  std::string name;           // kName: the variable; kNamespaceAttr: the namespace variable
  std::string attr;           // kNamespaceAttr
  std::vector<Target> items;  // kTuple
  SourcePos pos;
};

enum class StmtKind {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kBreak,
  kContinue,
  kScope,  // a body rendered in place ({% generation %} of transformers, {% print %})
};

struct Stmt {
  Stmt(StmtKind k, SourcePos p) : kind(k), pos(p) {}
  virtual ~Stmt() = default;
  StmtKind kind;
  SourcePos pos;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  TextStmt(SourcePos p, std::string t) : Stmt(StmtKind::kText, p), text(std::move(t)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(SourcePos p, ExprPtr e) : Stmt(StmtKind::kOutput, p), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(SourcePos p) : Stmt(StmtKind::kIf, p) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, then each elif
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(SourcePos p) : Stmt(StmtKind::kFor, p) {}
  Target target;
  ExprPtr iterable;
  ExprPtr filter;  // `for x in y if cond`; may be null
  bool recursive = false;
  Body body;
  Body else_body;
  // Frame locals that start undefined (see scoping.h), for the body and the else branch.
  std::vector<std::string> body_undefined;
  std::vector<std::string> else_undefined;
};

struct SetStmt : Stmt {
  explicit SetStmt(SourcePos p) : Stmt(StmtKind::kSet, p) {}
  Target target;
  ExprPtr value;
};

// {% set x | filters %}body{% endset %}: `filter` is a FilterExpr chain over a null operand, or
// null.
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(SourcePos p) : Stmt(StmtKind::kSetBlock, p) {}
  Target target;
  ExprPtr filter;
  Body body;
  std::vector<std::string> undefined_on_entry;
};

// A macro signature and body; also the body of a {% call %} block (the `caller`).
struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
  std::vector<std::string> undefined_on_entry;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(SourcePos p) : Stmt(StmtKind::kMacro, p) {}
  MacroDef def;
};

struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(SourcePos p) : Stmt(StmtKind::kCallBlock, p) {}
  MacroDef caller;  // named "caller"
  ExprPtr call;     // a CallExpr
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(SourcePos p) : Stmt(StmtKind::kFilterBlock, p) {}
  ExprPtr filter;  // a FilterExpr chain over a null operand
  Body body;
  std::vector<std::string> undefined_on_entry;
};

struct WithStmt : Stmt {
  explicit WithStmt(SourcePos p) : Stmt(StmtKind::kWith, p) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
  std::vector<std::string> undefined_on_entry;
};

struct ScopeStmt : Stmt {
  ScopeStmt(SourcePos p, bool frame) : Stmt(StmtKind::kScope, p), new_frame(frame) {}
  bool new_frame;  // {% generation %} is a frame of its own; {% print a, b %} is not
  Body body;
  std::vector<std::string> undefined_on_entry;
};

struct Program {
  Body body;
  std::vector<std::string> undefined_on_entry;
};

}  // namespace se::jinja::ast
