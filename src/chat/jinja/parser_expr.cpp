// Expression grammar, following jinja2's precedence from loosest to tightest:
// conditional, or, and, not, comparison, + -, ~, * / // %, **, unary - +, then postfix
// (attribute, subscript, call) and finally filters and tests.
#include <algorithm>

#include "chat/jinja/parser.h"

namespace se::jinja::detail {

Result<ast::ExprPtr> Parser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

Result<ast::ExprPtr> Parser::parse_condexpr() {
  DepthScope depth_scope(depth_);
  SE_RETURN_IF_ERROR(deepen());
  ast::SourcePos pos = current().pos;
  SE_ASSIGN_OR_RETURN(ast::ExprPtr expr, parse_or());
  while (skip_name("if")) {
    SE_RETURN_IF_ERROR(deepen());
    SE_ASSIGN_OR_RETURN(ast::ExprPtr test, parse_or());
    ast::ExprPtr otherwise;
    if (skip_name("else")) {
      SE_ASSIGN_OR_RETURN(otherwise, parse_condexpr());
    }
    expr = std::make_unique<ast::ConditionExpr>(pos, std::move(test), std::move(expr),
                                                std::move(otherwise));
    pos = current().pos;
  }
  return expr;
}

Result<ast::ExprPtr> Parser::parse_or() {
  DepthScope depth_scope(depth_);
  ast::SourcePos pos = current().pos;
  SE_ASSIGN_OR_RETURN(ast::ExprPtr left, parse_and());
  while (skip_name("or")) {
    SE_RETURN_IF_ERROR(deepen());
    SE_ASSIGN_OR_RETURN(ast::ExprPtr right, parse_and());
    left = std::make_unique<ast::LogicalExpr>(ast::ExprKind::kOr, pos, std::move(left),
                                              std::move(right));
  }
  return left;
}

Result<ast::ExprPtr> Parser::parse_and() {
  DepthScope depth_scope(depth_);
  ast::SourcePos pos = current().pos;
  SE_ASSIGN_OR_RETURN(ast::ExprPtr left, parse_not());
  while (skip_name("and")) {
    SE_RETURN_IF_ERROR(deepen());
    SE_ASSIGN_OR_RETURN(ast::ExprPtr right, parse_not());
    left = std::make_unique<ast::LogicalExpr>(ast::ExprKind::kAnd, pos, std::move(left),
                                              std::move(right));
  }
  return left;
}

Result<ast::ExprPtr> Parser::parse_not() {
  if (at_name("not")) {
    DepthScope depth_scope(depth_);
    SE_RETURN_IF_ERROR(deepen());
    ast::SourcePos pos = current().pos;
    advance();
    SE_ASSIGN_OR_RETURN(ast::ExprPtr operand, parse_not());
    return ast::ExprPtr(
        std::make_unique<ast::UnaryExpr>(ast::ExprKind::kNot, pos, std::move(operand)));
  }
  return parse_compare();
}

Result<ast::ExprPtr> Parser::parse_compare() {
  DepthScope depth_scope(depth_);
  ast::SourcePos pos = current().pos;
  SE_ASSIGN_OR_RETURN(ast::ExprPtr expr, parse_math1());
  std::unique_ptr<ast::CompareExpr> compare;
  while (true) {
    ast::CompareOp op;
    const Token& t = current();
    if (t.type == TokenType::kOperator && t.text == "==") {
      op = ast::CompareOp::kEq;
    } else if (t.type == TokenType::kOperator && t.text == "!=") {
      op = ast::CompareOp::kNe;
    } else if (t.type == TokenType::kOperator && t.text == "<") {
      op = ast::CompareOp::kLt;
    } else if (t.type == TokenType::kOperator && t.text == "<=") {
      op = ast::CompareOp::kLe;
    } else if (t.type == TokenType::kOperator && t.text == ">") {
      op = ast::CompareOp::kGt;
    } else if (t.type == TokenType::kOperator && t.text == ">=") {
      op = ast::CompareOp::kGe;
    } else if (at_name("in")) {
      op = ast::CompareOp::kIn;
    } else if (at_name("not") && peek().type == TokenType::kName && peek().text == "in") {
      op = ast::CompareOp::kNotIn;
      advance();
    } else {
      break;
    }
    advance();
    SE_RETURN_IF_ERROR(deepen());
    SE_ASSIGN_OR_RETURN(ast::ExprPtr rhs, parse_math1());
    if (!compare) compare = std::make_unique<ast::CompareExpr>(pos, std::move(expr));
    compare->rest.emplace_back(op, std::move(rhs));
  }
  if (compare) return ast::ExprPtr(std::move(compare));
  return expr;
}

Result<ast::ExprPtr> Parser::parse_math1() {
  DepthScope depth_scope(depth_);
  ast::SourcePos pos = current().pos;
  SE_ASSIGN_OR_RETURN(ast::ExprPtr left, parse_concat());
  while (at_operator("+") || at_operator("-")) {
    ast::BinaryOp op = at_operator("+") ? ast::BinaryOp::kAdd : ast::BinaryOp::kSub;
    advance();
    SE_RETURN_IF_ERROR(deepen());
    SE_ASSIGN_OR_RETURN(ast::ExprPtr right, parse_concat());
    left = std::make_unique<ast::BinaryExpr>(pos, op, std::move(left), std::move(right));
  }
  return left;
}

Result<ast::ExprPtr> Parser::parse_concat() {
  DepthScope depth_scope(depth_);
  ast::SourcePos pos = current().pos;
  SE_ASSIGN_OR_RETURN(ast::ExprPtr first, parse_math2());
  if (!at_operator("~")) return first;
  auto concat = std::make_unique<ast::ConcatExpr>(pos);
  concat->parts.push_back(std::move(first));
  while (skip_operator("~")) {
    SE_ASSIGN_OR_RETURN(ast::ExprPtr part, parse_math2());
    concat->parts.push_back(std::move(part));
  }
  return ast::ExprPtr(std::move(concat));
}

Result<ast::ExprPtr> Parser::parse_math2() {
  DepthScope depth_scope(depth_);
  ast::SourcePos pos = current().pos;
  SE_ASSIGN_OR_RETURN(ast::ExprPtr left, parse_pow());
  while (true) {
    ast::BinaryOp op;
    if (at_operator("*")) {
      op = ast::BinaryOp::kMul;
    } else if (at_operator("/")) {
      op = ast::BinaryOp::kDiv;
    } else if (at_operator("//")) {
      op = ast::BinaryOp::kFloorDiv;
    } else if (at_operator("%")) {
      op = ast::BinaryOp::kMod;
    } else {
      break;
    }
    advance();
    SE_RETURN_IF_ERROR(deepen());
    SE_ASSIGN_OR_RETURN(ast::ExprPtr right, parse_pow());
    left = std::make_unique<ast::BinaryExpr>(pos, op, std::move(left), std::move(right));
  }
  return left;
}

Result<ast::ExprPtr> Parser::parse_pow() {
  DepthScope depth_scope(depth_);
  ast::SourcePos pos = current().pos;
  SE_ASSIGN_OR_RETURN(ast::ExprPtr left, parse_unary(true));
  while (skip_operator("**")) {
    SE_RETURN_IF_ERROR(deepen());
    SE_ASSIGN_OR_RETURN(ast::ExprPtr right, parse_unary(true));
    left = std::make_unique<ast::BinaryExpr>(pos, ast::BinaryOp::kPow, std::move(left),
                                             std::move(right));
  }
  return left;
}

Result<ast::ExprPtr> Parser::parse_unary(bool with_filter) {
  DepthScope depth_scope(depth_);
  SE_RETURN_IF_ERROR(deepen());
  ast::SourcePos pos = current().pos;
  ast::ExprPtr node;
  if (at_operator("-") || at_operator("+")) {
    ast::ExprKind kind = at_operator("-") ? ast::ExprKind::kNeg : ast::ExprKind::kPos;
    advance();
    SE_ASSIGN_OR_RETURN(ast::ExprPtr operand, parse_unary(false));
    node = std::make_unique<ast::UnaryExpr>(kind, pos, std::move(operand));
  } else {
    SE_ASSIGN_OR_RETURN(node, parse_primary());
  }
  SE_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
  if (with_filter) {
    SE_ASSIGN_OR_RETURN(node, parse_filter_expr(std::move(node)));
  }
  return node;
}

Result<ast::ExprPtr> Parser::parse_primary() {
  const Token& token = current();
  ast::SourcePos pos = token.pos;
  switch (token.type) {
    case TokenType::kName: {
      std::string name = token.text;
      advance();
      if (name == "true" || name == "True") {
        return ast::ExprPtr(std::make_unique<ast::LiteralExpr>(pos, Value::boolean(true)));
      }
      if (name == "false" || name == "False") {
        return ast::ExprPtr(std::make_unique<ast::LiteralExpr>(pos, Value::boolean(false)));
      }
      if (name == "none" || name == "None") {
        return ast::ExprPtr(std::make_unique<ast::LiteralExpr>(pos, Value::none()));
      }
      if (name == "varargs" || name == "kwargs" || name == "caller") {
        for (ast::MacroDef* def : macro_stack_) {
          if (name == "varargs") def->uses_varargs = true;
          if (name == "kwargs") def->uses_kwargs = true;
          if (name == "caller") def->uses_caller = true;
        }
      }
      return ast::ExprPtr(std::make_unique<ast::NameExpr>(pos, std::move(name)));
    }
    case TokenType::kString: {
      // Adjacent literals concatenate, as in Python.
      std::string text;
      while (current().type == TokenType::kString) {
        text += current().text;
        advance();
      }
      return ast::ExprPtr(std::make_unique<ast::LiteralExpr>(pos, Value::string(std::move(text))));
    }
    case TokenType::kInteger: {
      Value v = Value::integer(token.int_value);
      advance();
      return ast::ExprPtr(std::make_unique<ast::LiteralExpr>(pos, std::move(v)));
    }
    case TokenType::kFloat: {
      Value v = Value::floating(token.float_value);
      advance();
      return ast::ExprPtr(std::make_unique<ast::LiteralExpr>(pos, std::move(v)));
    }
    case TokenType::kOperator:
      if (token.text == "(") {
        advance();
        SE_ASSIGN_OR_RETURN(ast::ExprPtr inner, parse_tuple(true, true, {}));
        SE_RETURN_IF_ERROR(expect_operator(")"));
        return inner;
      }
      if (token.text == "[") return parse_list();
      if (token.text == "{") return parse_dict();
      break;
    default:
      break;
  }
  if (token.type == TokenType::kEof) return error_here("unexpected end of template");
  return error_here(fmt::format("unexpected '{}'", describe(token)));
}

// Comma-separated expressions; a tuple when a comma appears. `extra_end_names` (e.g. "recursive")
// also end the list, as do `}}`, `%}` and `)`.
Result<ast::ExprPtr> Parser::parse_tuple(bool with_condexpr, bool explicit_parens,
                                         const std::vector<std::string_view>& extra_end_names) {
  ast::SourcePos pos = current().pos;
  auto tuple = std::make_unique<ast::ListExpr>(pos, true);
  bool is_tuple = false;
  while (true) {
    if (!tuple->items.empty()) SE_RETURN_IF_ERROR(expect_operator(","));
    bool at_end = current().type == TokenType::kVariableEnd ||
                  current().type == TokenType::kBlockEnd || at_operator(")") ||
                  (current().type == TokenType::kName &&
                   std::find(extra_end_names.begin(), extra_end_names.end(), current().text) !=
                       extra_end_names.end());
    if (at_end) break;
    SE_ASSIGN_OR_RETURN(ast::ExprPtr item, parse_expression(with_condexpr));
    tuple->items.push_back(std::move(item));
    if (at_operator(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!tuple->items.empty()) return std::move(tuple->items.front());
    if (!explicit_parens) {
      return error_here(fmt::format("Expected an expression, got '{}'", describe(current())));
    }
  }
  return ast::ExprPtr(std::move(tuple));
}

Result<ast::ExprPtr> Parser::parse_list() {
  auto list = std::make_unique<ast::ListExpr>(current().pos, false);
  SE_RETURN_IF_ERROR(expect_operator("["));
  while (!at_operator("]")) {
    if (!list->items.empty()) SE_RETURN_IF_ERROR(expect_operator(","));
    if (at_operator("]")) break;
    SE_ASSIGN_OR_RETURN(ast::ExprPtr item, parse_expression());
    list->items.push_back(std::move(item));
  }
  SE_RETURN_IF_ERROR(expect_operator("]"));
  return ast::ExprPtr(std::move(list));
}

Result<ast::ExprPtr> Parser::parse_dict() {
  auto dict = std::make_unique<ast::DictExpr>(current().pos);
  SE_RETURN_IF_ERROR(expect_operator("{"));
  while (!at_operator("}")) {
    if (!dict->items.empty()) SE_RETURN_IF_ERROR(expect_operator(","));
    if (at_operator("}")) break;
    SE_ASSIGN_OR_RETURN(ast::ExprPtr key, parse_expression());
    SE_RETURN_IF_ERROR(expect_operator(":"));
    SE_ASSIGN_OR_RETURN(ast::ExprPtr value, parse_expression());
    dict->items.emplace_back(std::move(key), std::move(value));
  }
  SE_RETURN_IF_ERROR(expect_operator("}"));
  return ast::ExprPtr(std::move(dict));
}

Result<ast::ExprPtr> Parser::parse_postfix(ast::ExprPtr node) {
  DepthScope depth_scope(depth_);
  while (true) {
    if (at_operator(".") || at_operator("[")) {
      SE_RETURN_IF_ERROR(deepen());
      SE_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node)));
    } else if (at_operator("(")) {
      SE_RETURN_IF_ERROR(deepen());
      ast::SourcePos pos = current().pos;
      auto call = std::make_unique<ast::CallExpr>(pos, std::move(node));
      SE_ASSIGN_OR_RETURN(call->args, parse_call_args());
      node = std::move(call);
    } else {
      return node;
    }
  }
}

Result<ast::ExprPtr> Parser::parse_filter_expr(ast::ExprPtr node) {
  DepthScope depth_scope(depth_);
  while (true) {
    if (at_operator("|")) {
      SE_RETURN_IF_ERROR(deepen());
      SE_ASSIGN_OR_RETURN(node, parse_filter(std::move(node), false));
    } else if (at_name("is")) {
      SE_RETURN_IF_ERROR(deepen());
      SE_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
    } else if (at_operator("(")) {
      SE_RETURN_IF_ERROR(deepen());
      ast::SourcePos pos = current().pos;
      auto call = std::make_unique<ast::CallExpr>(pos, std::move(node));
      SE_ASSIGN_OR_RETURN(call->args, parse_call_args());
      node = std::move(call);
    } else {
      return node;
    }
  }
}

Result<ast::ExprPtr> Parser::parse_subscript(ast::ExprPtr node) {
  ast::SourcePos pos = current().pos;
  if (skip_operator(".")) {
    const Token& attr = current();
    if (attr.type == TokenType::kName) {
      std::string name = attr.text;
      advance();
      return ast::ExprPtr(
          std::make_unique<ast::GetAttrExpr>(pos, std::move(node), std::move(name)));
    }
    if (attr.type != TokenType::kInteger) return error_here("expected name or number");
    auto index = std::make_unique<ast::LiteralExpr>(attr.pos, Value::integer(attr.int_value));
    advance();
    return ast::ExprPtr(std::make_unique<ast::GetItemExpr>(pos, std::move(node), std::move(index)));
  }
  SE_RETURN_IF_ERROR(expect_operator("["));
  std::vector<ast::ExprPtr> args;
  while (!at_operator("]")) {
    if (!args.empty()) SE_RETURN_IF_ERROR(expect_operator(","));
    SE_ASSIGN_OR_RETURN(ast::ExprPtr arg, parse_subscribed());
    args.push_back(std::move(arg));
  }
  SE_RETURN_IF_ERROR(expect_operator("]"));
  ast::ExprPtr index;
  if (args.size() == 1) {
    index = std::move(args.front());
  } else {
    auto tuple = std::make_unique<ast::ListExpr>(pos, true);
    tuple->items = std::move(args);
    index = std::move(tuple);
  }
  return ast::ExprPtr(std::make_unique<ast::GetItemExpr>(pos, std::move(node), std::move(index)));
}

// One subscript: an expression or a slice `start:stop:step` with any part omitted.
Result<ast::ExprPtr> Parser::parse_subscribed() {
  ast::SourcePos pos = current().pos;
  auto slice = std::make_unique<ast::SliceExpr>(pos);
  if (!skip_operator(":")) {
    SE_ASSIGN_OR_RETURN(ast::ExprPtr start, parse_expression());
    if (!skip_operator(":")) return start;
    slice->start = std::move(start);
  }
  if (!at_operator(":") && !at_operator("]") && !at_operator(",")) {
    SE_ASSIGN_OR_RETURN(slice->stop, parse_expression());
  }
  if (skip_operator(":")) {
    if (!at_operator("]") && !at_operator(",")) {
      SE_ASSIGN_OR_RETURN(slice->step, parse_expression());
    }
  }
  return ast::ExprPtr(std::move(slice));
}

Result<ast::Args> Parser::parse_call_args() {
  const Token& open = current();
  ast::SourcePos open_pos = open.pos;
  SE_RETURN_IF_ERROR(expect_operator("("));
  ast::Args args;
  bool require_comma = false;
  while (!at_operator(")")) {
    if (require_comma) {
      SE_RETURN_IF_ERROR(expect_operator(","));
      if (at_operator(")")) break;
    }
    if (at_operator("*") || at_operator("**")) {
      return error_here("*args and **kwargs in calls are not supported");
    }
    if (current().type == TokenType::kName && peek().type == TokenType::kOperator &&
        peek().text == "=") {
      std::string key = current().text;
      advance();
      advance();
      SE_ASSIGN_OR_RETURN(ast::ExprPtr value, parse_expression());
      args.keyword.emplace_back(std::move(key), std::move(value));
    } else {
      if (!args.keyword.empty()) {
        return invalid_argument("line {}, column {}: invalid syntax for function call expression",
                                open_pos.line, open_pos.column);
      }
      SE_ASSIGN_OR_RETURN(ast::ExprPtr value, parse_expression());
      args.positional.push_back(std::move(value));
    }
    require_comma = true;
  }
  SE_RETURN_IF_ERROR(expect_operator(")"));
  return args;
}

Result<ast::ExprPtr> Parser::parse_filter(ast::ExprPtr node, bool start_inline) {
  DepthScope depth_scope(depth_);
  while (at_operator("|") || start_inline) {
    if (!start_inline) advance();
    start_inline = false;
    SE_RETURN_IF_ERROR(deepen());
    ast::SourcePos pos = current().pos;
    SE_ASSIGN_OR_RETURN(std::string name, expect_name());
    while (skip_operator(".")) {
      SE_ASSIGN_OR_RETURN(std::string part, expect_name());
      name += "." + part;
    }
    auto filter = std::make_unique<ast::FilterExpr>(pos, std::move(node), std::move(name));
    if (at_operator("(")) {
      SE_ASSIGN_OR_RETURN(filter->args, parse_call_args());
    }
    node = std::move(filter);
  }
  return node;
}

Result<ast::ExprPtr> Parser::parse_test(ast::ExprPtr node) {
  ast::SourcePos pos = current().pos;
  advance();  // `is`
  bool negated = skip_name("not");
  SE_ASSIGN_OR_RETURN(std::string name, expect_name());
  while (skip_operator(".")) {
    SE_ASSIGN_OR_RETURN(std::string part, expect_name());
    name += "." + part;
  }
  auto test = std::make_unique<ast::TestExpr>(pos, std::move(node), std::move(name));
  const Token& t = current();
  bool arg_start = t.type == TokenType::kName || t.type == TokenType::kString ||
                   t.type == TokenType::kInteger || t.type == TokenType::kFloat ||
                   (t.type == TokenType::kOperator && (t.text == "[" || t.text == "{"));
  if (at_operator("(")) {
    SE_ASSIGN_OR_RETURN(test->args, parse_call_args());
  } else if (arg_start && !at_name("else") && !at_name("or") && !at_name("and")) {
    if (at_name("is")) return error_here("You cannot chain multiple tests with is");
    // A single argument without parentheses: `x is divisibleby 3`, `x is sameas false`.
    SE_ASSIGN_OR_RETURN(ast::ExprPtr arg, parse_primary());
    SE_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
    test->args.positional.push_back(std::move(arg));
  }
  if (negated) {
    return ast::ExprPtr(
        std::make_unique<ast::UnaryExpr>(ast::ExprKind::kNot, pos, std::move(test)));
  }
  return ast::ExprPtr(std::move(test));
}

}  // namespace se::jinja::detail
