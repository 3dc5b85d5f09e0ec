#include "chat/jinja/parser.h"

#include <algorithm>

#include "chat/jinja/scoping.h"

namespace se::jinja {
namespace detail {
namespace {

constexpr int kMaxNesting = 200;

bool contains(const std::vector<std::string_view>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool target_binds(const ast::Target& target, std::string_view name) {
  if (target.kind == ast::Target::Kind::kName) return target.name == name;
  return std::any_of(target.items.begin(), target.items.end(),
                     [&](const ast::Target& t) { return target_binds(t, name); });
}

}  // namespace

const Token& Parser::peek(size_t ahead) const {
  return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
}

bool Parser::at_operator(std::string_view op) const {
  return current().type == TokenType::kOperator && current().text == op;
}

bool Parser::at_name(std::string_view name) const {
  return current().type == TokenType::kName && current().text == name;
}

bool Parser::skip_operator(std::string_view op) {
  if (!at_operator(op)) return false;
  advance();
  return true;
}

bool Parser::skip_name(std::string_view name) {
  if (!at_name(name)) return false;
  advance();
  return true;
}

std::string Parser::describe(const Token& token) {
  switch (token.type) {
    case TokenType::kData:
      return "template data / text";
    case TokenType::kVariableBegin:
      return "begin of print statement";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "begin of statement block";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kName:
    case TokenType::kOperator:
      return token.text;
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kEof:
      return "end of template";
  }
  return "token";
}

Status Parser::error(const Token& at, const std::string& message) const {
  return invalid_argument("line {}, column {}: {}", at.pos.line, at.pos.column, message);
}

Status Parser::expect_operator(std::string_view op) {
  if (skip_operator(op)) return Status::ok();
  if (current().type == TokenType::kEof) {
    return error_here(fmt::format("unexpected end of template, expected '{}'", op));
  }
  return error_here(fmt::format("expected token '{}', got '{}'", op, describe(current())));
}

Result<std::string> Parser::expect_name() {
  if (current().type != TokenType::kName) {
    return error_here(fmt::format("expected token 'name', got '{}'", describe(current())));
  }
  std::string name = current().text;
  advance();
  return name;
}

Status Parser::expect(TokenType type) {
  if (current().type == type) {
    advance();
    return Status::ok();
  }
  Token wanted;
  wanted.type = type;
  if (current().type == TokenType::kEof) {
    return error_here(fmt::format("unexpected end of template, expected '{}'", describe(wanted)));
  }
  return error_here(
      fmt::format("expected token '{}', got '{}'", describe(wanted), describe(current())));
}

Status Parser::deepen() {
  if (++depth_ > kMaxNesting) {
    return error_here(fmt::format("template nesting deeper than {} levels", kMaxNesting));
  }
  return Status::ok();
}

Result<std::unique_ptr<ast::Program>> Parser::parse() {
  auto program = std::make_unique<ast::Program>();
  SE_ASSIGN_OR_RETURN(program->body, subparse({}));
  if (current().type != TokenType::kEof) return error_here("unexpected tokens after the template");
  SE_RETURN_IF_ERROR(check_names(program->body, false));
  resolve_frames(*program);
  return program;
}

// Reads text, {{ }} and statements until a {% tag %} whose name is in `end_tags`; the current token
// is then that name.
Result<ast::Body> Parser::subparse(const std::vector<std::string_view>& end_tags) {
  ast::Body body;
  while (current().type != TokenType::kEof) {
    const Token& token = current();
    if (token.type == TokenType::kData) {
      body.push_back(std::make_unique<ast::TextStmt>(token.pos, token.text));
      advance();
    } else if (token.type == TokenType::kVariableBegin) {
      ast::SourcePos pos = token.pos;
      advance();
      SE_ASSIGN_OR_RETURN(ast::ExprPtr expr, parse_tuple(true, false, {}));
      SE_RETURN_IF_ERROR(expect(TokenType::kVariableEnd));
      body.push_back(std::make_unique<ast::OutputStmt>(pos, std::move(expr)));
    } else if (token.type == TokenType::kBlockBegin) {
      advance();
      if (current().type == TokenType::kName && contains(end_tags, current().text)) return body;
      SE_ASSIGN_OR_RETURN(ast::StmtPtr stmt, parse_statement());
      body.push_back(std::move(stmt));
      SE_RETURN_IF_ERROR(expect(TokenType::kBlockEnd));
    } else {
      return error_here(fmt::format("unexpected '{}'", describe(token)));
    }
  }
  return body;
}

Result<ast::Body> Parser::parse_statements(const std::vector<std::string_view>& end_tags,
                                           bool drop_end) {
  skip_operator(":");
  SE_RETURN_IF_ERROR(expect(TokenType::kBlockEnd));
  SE_ASSIGN_OR_RETURN(ast::Body body, subparse(end_tags));
  if (current().type == TokenType::kEof) {
    std::string wanted;
    for (std::string_view t : end_tags)
      wanted += (wanted.empty() ? "'" : " or '") + std::string(t) + "'";
    return error_here(
        "Unexpected end of template. Jinja was looking for the following tags: " + wanted + ".");
  }
  if (drop_end) advance();
  return body;
}

Result<ast::StmtPtr> Parser::parse_statement() {
  DepthScope depth_scope(depth_);
  SE_RETURN_IF_ERROR(deepen());
  const Token& token = current();
  if (token.type != TokenType::kName) return error_here("tag name expected");
  const std::string& tag = token.text;
  if (tag == "if") return parse_if();
  if (tag == "for") return parse_for();
  if (tag == "set") return parse_set();
  if (tag == "macro") return parse_macro();
  if (tag == "call") return parse_call_block();
  if (tag == "filter") return parse_filter_block();
  if (tag == "with") return parse_with();
  if (tag == "print") {
    ast::SourcePos pos = token.pos;
    advance();
    auto list = std::make_unique<ast::ListExpr>(pos, true);
    while (current().type != TokenType::kBlockEnd) {
      if (!list->items.empty()) SE_RETURN_IF_ERROR(expect_operator(","));
      SE_ASSIGN_OR_RETURN(ast::ExprPtr e, parse_expression());
      list->items.push_back(std::move(e));
    }
    // {% print a, b %} writes each expression, like consecutive {{ }}.
    auto scope = std::make_unique<ast::ScopeStmt>(pos, false);
    for (ast::ExprPtr& e : list->items) {
      scope->body.push_back(std::make_unique<ast::OutputStmt>(e->pos, std::move(e)));
    }
    return ast::StmtPtr(std::move(scope));
  }
  if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) return error_here(fmt::format("'{}' outside of a for loop", tag));
    auto stmt = std::make_unique<ast::Stmt>(
        tag == "break" ? ast::StmtKind::kBreak : ast::StmtKind::kContinue, token.pos);
    advance();
    return stmt;
  }
  if (tag == "generation") {
    // transformers' AssistantTracker tag: renders its body unchanged.
    auto scope = std::make_unique<ast::ScopeStmt>(token.pos, true);
    advance();
    SE_ASSIGN_OR_RETURN(scope->body, parse_statements({"endgeneration"}, true));
    return ast::StmtPtr(std::move(scope));
  }
  static constexpr std::string_view kUnsupported[] = {"block", "extends",    "include", "import",
                                                      "from",  "autoescape", "do",      "trans"};
  for (std::string_view t : kUnsupported) {
    if (tag == t) return error_here(fmt::format("tag '{}' is not supported", tag));
  }
  return error_here(fmt::format("Encountered unknown tag '{}'.", tag));
}

Result<ast::StmtPtr> Parser::parse_if() {
  auto stmt = std::make_unique<ast::IfStmt>(current().pos);
  advance();
  while (true) {
    SE_ASSIGN_OR_RETURN(ast::ExprPtr test, parse_tuple(false, false, {}));
    SE_ASSIGN_OR_RETURN(ast::Body body, parse_statements({"elif", "else", "endif"}, false));
    stmt->branches.emplace_back(std::move(test), std::move(body));
    std::string tag = current().text;
    advance();
    if (tag == "elif") continue;
    if (tag == "else") {
      SE_ASSIGN_OR_RETURN(stmt->else_body, parse_statements({"endif"}, true));
    }
    break;
  }
  return ast::StmtPtr(std::move(stmt));
}

Result<ast::StmtPtr> Parser::parse_for() {
  auto stmt = std::make_unique<ast::ForStmt>(current().pos);
  advance();
  const Token target_token = current();
  SE_ASSIGN_OR_RETURN(stmt->target, parse_assign_target(false, true));
  if (target_binds(stmt->target, "loop")) {
    return error(target_token, "Can't assign to special loop variable in for-loop target");
  }
  if (!skip_name("in")) {
    return error_here(fmt::format("expected token 'in', got '{}'", describe(current())));
  }
  SE_ASSIGN_OR_RETURN(stmt->iterable, parse_tuple(false, false, {"recursive"}));
  if (skip_name("if")) {
    SE_ASSIGN_OR_RETURN(stmt->filter, parse_expression());
  }
  stmt->recursive = skip_name("recursive");
  ++loop_depth_;
  auto body = parse_statements({"endfor", "else"}, false);
  --loop_depth_;
  if (!body.is_ok()) return body.status();
  stmt->body = std::move(body).value();
  std::string tag = current().text;
  advance();
  if (tag == "else") {
    SE_ASSIGN_OR_RETURN(stmt->else_body, parse_statements({"endfor"}, true));
  }
  return ast::StmtPtr(std::move(stmt));
}

Result<ast::StmtPtr> Parser::parse_set() {
  ast::SourcePos pos = current().pos;
  advance();
  SE_ASSIGN_OR_RETURN(ast::Target target, parse_assign_target(true, false));
  if (skip_operator("=")) {
    auto stmt = std::make_unique<ast::SetStmt>(pos);
    stmt->target = std::move(target);
    SE_ASSIGN_OR_RETURN(stmt->value, parse_tuple(true, false, {}));
    return ast::StmtPtr(std::move(stmt));
  }
  auto stmt = std::make_unique<ast::SetBlockStmt>(pos);
  stmt->target = std::move(target);
  if (at_operator("|")) {
    SE_ASSIGN_OR_RETURN(stmt->filter, parse_filter(nullptr, false));
  }
  SE_ASSIGN_OR_RETURN(stmt->body, parse_statements({"endset"}, true));
  return ast::StmtPtr(std::move(stmt));
}

Status Parser::parse_signature(ast::MacroDef* def) {
  SE_RETURN_IF_ERROR(expect_operator("("));
  while (!at_operator(")")) {
    if (!def->params.empty()) SE_RETURN_IF_ERROR(expect_operator(","));
    SE_ASSIGN_OR_RETURN(std::string name, expect_name());
    def->params.push_back(std::move(name));
    if (skip_operator("=")) {
      SE_ASSIGN_OR_RETURN(ast::ExprPtr d, parse_expression());
      def->defaults.push_back(std::move(d));
    } else if (!def->defaults.empty()) {
      return error_here("non-default argument follows default argument");
    }
  }
  return expect_operator(")");
}

Result<ast::StmtPtr> Parser::parse_macro() {
  auto stmt = std::make_unique<ast::MacroStmt>(current().pos);
  advance();
  SE_ASSIGN_OR_RETURN(stmt->def.name, expect_name());
  SE_RETURN_IF_ERROR(parse_signature(&stmt->def));
  macro_stack_.push_back(&stmt->def);
  int saved_loops = loop_depth_;
  loop_depth_ = 0;  // a macro body is its own function: break/continue cannot cross it
  auto body = parse_statements({"endmacro"}, true);
  loop_depth_ = saved_loops;
  macro_stack_.pop_back();
  if (!body.is_ok()) return body.status();
  stmt->def.body = std::move(body).value();
  return ast::StmtPtr(std::move(stmt));
}

Result<ast::StmtPtr> Parser::parse_call_block() {
  auto stmt = std::make_unique<ast::CallBlockStmt>(current().pos);
  advance();
  stmt->caller.name = "caller";
  if (at_operator("(")) SE_RETURN_IF_ERROR(parse_signature(&stmt->caller));
  SE_ASSIGN_OR_RETURN(stmt->call, parse_expression());
  if (stmt->call->kind != ast::ExprKind::kCall) return error(current(), "expected call");
  macro_stack_.push_back(&stmt->caller);
  int saved_loops = loop_depth_;
  loop_depth_ = 0;
  auto body = parse_statements({"endcall"}, true);
  loop_depth_ = saved_loops;
  macro_stack_.pop_back();
  if (!body.is_ok()) return body.status();
  stmt->caller.body = std::move(body).value();
  return ast::StmtPtr(std::move(stmt));
}

Result<ast::StmtPtr> Parser::parse_filter_block() {
  auto stmt = std::make_unique<ast::FilterBlockStmt>(current().pos);
  advance();
  SE_ASSIGN_OR_RETURN(stmt->filter, parse_filter(nullptr, true));
  SE_ASSIGN_OR_RETURN(stmt->body, parse_statements({"endfilter"}, true));
  return ast::StmtPtr(std::move(stmt));
}

Result<ast::StmtPtr> Parser::parse_with() {
  auto stmt = std::make_unique<ast::WithStmt>(current().pos);
  advance();
  while (current().type != TokenType::kBlockEnd) {
    if (!stmt->assignments.empty()) SE_RETURN_IF_ERROR(expect_operator(","));
    SE_ASSIGN_OR_RETURN(ast::Target target, parse_assign_target(false, false));
    SE_RETURN_IF_ERROR(expect_operator("="));
    SE_ASSIGN_OR_RETURN(ast::ExprPtr value, parse_expression());
    stmt->assignments.emplace_back(std::move(target), std::move(value));
  }
  SE_ASSIGN_OR_RETURN(stmt->body, parse_statements({"endwith"}, true));
  return ast::StmtPtr(std::move(stmt));
}

// A target list like jinja2's parse_assign_target: names (or ns.attr) separated by commas,
// parenthesized groups allowed; `stop_at_in` ends the list at `in` (for loops).
Result<ast::Target> Parser::parse_assign_target(bool with_namespace, bool stop_at_in) {
  ast::Target tuple;
  tuple.kind = ast::Target::Kind::kTuple;
  tuple.pos = current().pos;
  bool is_tuple = false;
  while (true) {
    if (!tuple.items.empty()) SE_RETURN_IF_ERROR(expect_operator(","));
    bool at_end = current().type == TokenType::kVariableEnd ||
                  current().type == TokenType::kBlockEnd || at_operator(")") ||
                  (stop_at_in && at_name("in"));
    if (at_end) break;
    SE_ASSIGN_OR_RETURN(ast::Target item, parse_target_primary(with_namespace));
    tuple.items.push_back(std::move(item));
    if (at_operator(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (tuple.items.empty()) {
      return error_here(fmt::format("Expected an expression, got '{}'", describe(current())));
    }
    return std::move(tuple.items.front());
  }
  return tuple;
}

Result<ast::Target> Parser::parse_target_primary(bool with_namespace) {
  DepthScope depth_scope(depth_);
  SE_RETURN_IF_ERROR(deepen());
  ast::Target target;
  target.pos = current().pos;
  if (current().type == TokenType::kName) {
    static constexpr std::string_view kConstants[] = {"true", "false", "none",
                                                      "True", "False", "None"};
    for (std::string_view c : kConstants) {
      if (current().text == c) return error_here("can't assign to 'const'");
    }
    target.name = current().text;
    advance();
    if (with_namespace && at_operator(".")) {
      advance();
      target.kind = ast::Target::Kind::kNamespaceAttr;
      SE_ASSIGN_OR_RETURN(target.attr, expect_name());
    }
    return target;
  }
  if (skip_operator("(")) {
    SE_ASSIGN_OR_RETURN(target, parse_assign_target(false, false));
    SE_RETURN_IF_ERROR(expect_operator(")"));
    return target;
  }
  return error_here(fmt::format("can't assign to '{}'", describe(current())));
}

}  // namespace detail

Result<std::unique_ptr<ast::Program>> parse_template(std::string_view source) {
  SE_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  detail::Parser parser(std::move(tokens));
  return parser.parse();
}

}  // namespace se::jinja
