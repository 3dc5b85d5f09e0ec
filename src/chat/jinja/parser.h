// Parser: turns the token stream into an ast::Program with jinja2's grammar and operator
// precedence. Like jinja2's compiler it rejects unknown filters and tests at parse time, except
// inside if-statements and conditional expressions, where the error waits until the filter runs.
// Nesting depth is bounded so hostile templates cannot exhaust the stack. One Parser per parse
// call.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "chat/jinja/ast.h"
#include "chat/jinja/lexer.h"

namespace se::jinja {

// Errors are kInvalidArgument with "line L, column C: ...".
Result<std::unique_ptr<ast::Program>> parse_template(std::string_view source);

namespace detail {

// Restores the parser's nesting depth when a recursive descent returns.
class DepthScope {
 public:
  explicit DepthScope(int& depth) : depth_(depth), saved_(depth) {}
  ~DepthScope() { depth_ = saved_; }
  DepthScope(const DepthScope&) = delete;
  DepthScope& operator=(const DepthScope&) = delete;

 private:
  int& depth_;
  int saved_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}
  Result<std::unique_ptr<ast::Program>> parse();

 private:
  // Statements (parser.cpp).
  Result<ast::Body> subparse(const std::vector<std::string_view>& end_tags);
  Result<ast::Body> parse_statements(const std::vector<std::string_view>& end_tags, bool drop_end);
  Result<ast::StmtPtr> parse_statement();
  Result<ast::StmtPtr> parse_if();
  Result<ast::StmtPtr> parse_for();
  Result<ast::StmtPtr> parse_set();
  Result<ast::StmtPtr> parse_macro();
  Result<ast::StmtPtr> parse_call_block();
  Result<ast::StmtPtr> parse_filter_block();
  Result<ast::StmtPtr> parse_with();
  Status parse_signature(ast::MacroDef* def);
  Result<ast::Target> parse_assign_target(bool with_namespace, bool stop_at_in);
  Result<ast::Target> parse_target_primary(bool with_namespace);

  // Expressions (parser_expr.cpp).
  Result<ast::ExprPtr> parse_expression(bool with_condexpr = true);
  Result<ast::ExprPtr> parse_condexpr();
  Result<ast::ExprPtr> parse_or();
  Result<ast::ExprPtr> parse_and();
  Result<ast::ExprPtr> parse_not();
  Result<ast::ExprPtr> parse_compare();
  Result<ast::ExprPtr> parse_math1();
  Result<ast::ExprPtr> parse_concat();
  Result<ast::ExprPtr> parse_math2();
  Result<ast::ExprPtr> parse_pow();
  Result<ast::ExprPtr> parse_unary(bool with_filter);
  Result<ast::ExprPtr> parse_primary();
  Result<ast::ExprPtr> parse_tuple(bool with_condexpr, bool explicit_parens,
                                   const std::vector<std::string_view>& extra_end_names);
  Result<ast::ExprPtr> parse_list();
  Result<ast::ExprPtr> parse_dict();
  Result<ast::ExprPtr> parse_postfix(ast::ExprPtr node);
  Result<ast::ExprPtr> parse_filter_expr(ast::ExprPtr node);
  Result<ast::ExprPtr> parse_subscript(ast::ExprPtr node);
  Result<ast::ExprPtr> parse_subscribed();
  Result<ast::Args> parse_call_args();
  // Parses `| name(args) | ...` over `node` (null for filter blocks); `start_inline` skips the
  // first pipe.
  Result<ast::ExprPtr> parse_filter(ast::ExprPtr node, bool start_inline);
  Result<ast::ExprPtr> parse_test(ast::ExprPtr node);

  // Token stream helpers.
  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const;
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool at_operator(std::string_view op) const;
  bool at_name(std::string_view name) const;
  bool skip_operator(std::string_view op);
  bool skip_name(std::string_view name);
  Status expect_operator(std::string_view op);
  Result<std::string> expect_name();
  Status expect(TokenType type);
  Status error(const Token& at, const std::string& message) const;
  Status error_here(const std::string& message) const { return error(current(), message); }
  static std::string describe(const Token& token);

  // Nesting bound: every recursive descent and every left-deep chain link counts one level.
  Status deepen();

  // Filter/test names are checked after parsing, with jinja2's rule for if-statements.
  Status check_names(ast::Body& body, bool soft);
  Status check_expr(ast::Expr* expr, bool soft);
  Status check_args(ast::Args& args, bool soft);

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;                       // for break/continue
  std::vector<ast::MacroDef*> macro_stack_;  // macros being parsed, for varargs/kwargs/caller use
};

}  // namespace detail
}  // namespace se::jinja
