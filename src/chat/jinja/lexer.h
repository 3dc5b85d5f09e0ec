// Lexer: splits template source into tokens the way jinja2's lexer does with trim_blocks=True and
// lstrip_blocks=True: newlines normalized to \n, one trailing newline dropped, whitespace control
// (`{%-`, `-%}`, `{%+`, `+%}`) and block trimming applied to the text tokens, comments dropped,
// {% raw %} bodies passed through as text. Stateless apart from the call; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "chat/jinja/ast.h"

namespace se::jinja {

enum class TokenType {
  kData,           // template text, whitespace control already applied
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // text holds the unescaped value
  kInteger,
  kFloat,
  kOperator,  // text holds the operator, e.g. "//" or "("
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0.0;
  ast::SourcePos pos;
};

// Errors are kInvalidArgument with "line L, column C: ..." (columns count code points from 1).
Result<std::vector<Token>> tokenize(std::string_view source);

}  // namespace se::jinja
