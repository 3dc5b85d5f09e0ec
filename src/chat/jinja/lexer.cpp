#include "chat/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

// jinja2 splits the source on \r\n, \r and \n, drops one trailing empty line and joins with \n.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t q = find_tag(pos);
      if (q == std::string::npos) {
        emit_data(src_.substr(pos), pos);
        break;
      }
      char kind = src_[q + 1];
      size_t raw_end = kind == '%' ? match_raw_begin(q) : std::string::npos;
      char sign =
          (q + 2 < src_.size() && (src_[q + 2] == '-' || src_[q + 2] == '+')) ? src_[q + 2] : 0;
      std::string text = strip_text(src_.substr(pos, q - pos), sign, kind != '{', line_starting);
      emit_data(std::move(text), pos);
      size_t p = q + 2 + (sign != 0 ? 1 : 0);
      if (raw_end != std::string::npos) {
        SE_ASSIGN_OR_RETURN(pos, lex_raw(q, raw_end, &line_starting));
      } else if (kind == '#') {
        SE_ASSIGN_OR_RETURN(pos, skip_comment(q, p, &line_starting));
      } else {
        push(kind == '{' ? TokenType::kVariableBegin : TokenType::kBlockBegin, "", q);
        SE_ASSIGN_OR_RETURN(pos, lex_tag(p, kind == '%', &line_starting));
      }
    }
    push(TokenType::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  // Line and code-point column of a byte offset; incremental because tokens arrive in order.
  ast::SourcePos position(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line_start = *(it - 1);
    int line = static_cast<int>(it - line_starts_.begin());
    size_t from = line_start;
    int column = 1;
    if (cache_line_ == line && cache_offset_ <= offset) {
      from = cache_offset_;
      column = cache_column_;
    }
    column += static_cast<int>(utf8_length(std::string_view(src_).substr(from, offset - from)));
    cache_line_ = line;
    cache_offset_ = offset;
    cache_column_ = column;
    return {line, column};
  }

  Status error(size_t offset, const std::string& message) const {
    ast::SourcePos p = position(offset);
    return invalid_argument("line {}, column {}: {}", p.line, p.column, message);
  }

  void push(TokenType type, std::string text, size_t offset) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.pos = position(offset);
    tokens_.push_back(std::move(t));
  }

  void emit_data(std::string text, size_t offset) {
    if (!text.empty()) push(TokenType::kData, std::move(text), offset);
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  bool space_at(size_t i) const {
    if (i >= src_.size()) return false;
    unsigned char c = static_cast<unsigned char>(src_[i]);
    if (c < 0x80) return py_isspace(c);
    return py_isspace(utf8_decode(std::string_view(src_).substr(i, 4)).front());
  }

  size_t skip_spaces(size_t i) const {
    while (i < src_.size()) {
      unsigned char c = static_cast<unsigned char>(src_[i]);
      if (c < 0x80) {
        if (!py_isspace(c)) break;
        ++i;
      } else {
        size_t n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        if (!py_isspace(utf8_decode(std::string_view(src_).substr(i, n)).front())) break;
        i += n;
      }
    }
    return i;
  }

  // Whitespace control for the text before a tag: `-` strips all trailing whitespace; otherwise
  // lstrip_blocks removes the indentation before a block or comment tag that starts its line.
  std::string strip_text(std::string text, char sign, bool lstrip_applies,
                         bool line_starting) const {
    if (sign == '-') return py_strip(text, nullptr, StripSide::kRight);
    if (sign == '+' || !lstrip_applies) return text;
    size_t last_nl = text.rfind('\n');
    size_t l_pos = last_nl == std::string::npos ? 0 : last_nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    std::string_view tail = std::string_view(text).substr(l_pos);
    if (tail.empty()) return text;
    std::u32string cps = utf8_decode(tail);
    if (std::all_of(cps.begin(), cps.end(), py_isspace)) text.resize(l_pos);
    return text;
  }

  // End of a block tag at i: `+%}`, `-%}` plus following whitespace, or `%}` plus one newline.
  size_t match_block_end(size_t i) const {
    if (src_.compare(i, 3, "+%}") == 0) return i + 3;
    if (src_.compare(i, 3, "-%}") == 0) return skip_spaces(i + 3);
    if (src_.compare(i, 2, "%}") == 0)
      return (i + 2 < src_.size() && src_[i + 2] == '\n') ? i + 3 : i + 2;
    return std::string::npos;
  }

  size_t match_variable_end(size_t i) const {
    if (src_.compare(i, 3, "-}}") == 0) return skip_spaces(i + 3);
    if (src_.compare(i, 2, "}}") == 0) return i + 2;
    return std::string::npos;
  }

  // `{%[-+]? raw (-%}\s*|%})` at q: returns the end of the opening tag or npos.
  size_t match_raw_begin(size_t q) const {
    size_t i = q + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i = skip_spaces(i);
    if (src_.compare(i, 3, "raw") != 0) return std::string::npos;
    i = skip_spaces(i + 3);
    if (src_.compare(i, 3, "-%}") == 0) return skip_spaces(i + 3);
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return std::string::npos;
  }

  Result<size_t> lex_raw(size_t q, size_t body, bool* line_starting) {
    *line_starting = src_[body - 1] == '\n';
    for (size_t s = find_tag(body); s != std::string::npos; s = find_tag(s + 1)) {
      if (src_[s + 1] != '%') continue;
      size_t i = s + 2;
      char sign = (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ? src_[i] : 0;
      if (sign != 0) ++i;
      i = skip_spaces(i);
      if (src_.compare(i, 6, "endraw") != 0) continue;
      size_t end = match_block_end(skip_spaces(i + 6));
      if (end == std::string::npos) continue;
      emit_data(strip_text(src_.substr(body, s - body), sign, true, *line_starting), body);
      *line_starting = src_[end - 1] == '\n';
      return end;
    }
    return error(q, "Missing end of raw directive");
  }

  Result<size_t> skip_comment(size_t q, size_t p, bool* line_starting) {
    size_t e = src_.find("#}", p);
    if (e == std::string::npos) return error(q, "Missing end of comment tag");
    size_t end;
    if (e > p && src_[e - 1] == '+') {
      end = e + 2;
    } else if (e > p && src_[e - 1] == '-') {
      end = skip_spaces(e + 2);
    } else {
      end = (e + 2 < src_.size() && src_[e + 2] == '\n') ? e + 3 : e + 2;
    }
    *line_starting = src_[end - 1] == '\n';
    return end;
  }

  // Tokens inside {{ }} or {% %}; returns the offset after the closing delimiter.
  Result<size_t> lex_tag(size_t i, bool block, bool* line_starting) {
    std::vector<char> balance;
    while (i < src_.size()) {
      if (balance.empty()) {
        size_t end = block ? match_block_end(i) : match_variable_end(i);
        if (end != std::string::npos) {
          push(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", i);
          *line_starting = src_[end - 1] == '\n';
          return end;
        }
      }
      if (space_at(i)) {
        i = skip_spaces(i);
        continue;
      }
      size_t next;
      if ((next = lex_float(i)) != std::string::npos ||
          (next = lex_integer(i)) != std::string::npos) {
        SE_RETURN_IF_ERROR(number_error_);
        i = next;
        continue;
      }
      char c = src_[i];
      if (is_name_start(c)) {
        size_t j = i;
        while (j < src_.size() && is_name_char(src_[j])) ++j;
        push(TokenType::kName, src_.substr(i, j - i), i);
        i = j;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t close = find_string_end(i);
        if (close != std::string::npos) {
          SE_ASSIGN_OR_RETURN(std::string value, unescape(i + 1, close));
          push(TokenType::kString, std::move(value), i);
          i = close + 1;
          continue;
        }
      }
      SE_ASSIGN_OR_RETURN(i, lex_operator(i, &balance));
    }
    return i;
  }

  size_t match_digits(size_t i) const {
    if (i >= src_.size() || !is_digit(src_[i])) return std::string::npos;
    while (i < src_.size() && is_digit(src_[i])) ++i;
    while (i + 1 < src_.size() && src_[i] == '_' && is_digit(src_[i + 1])) {
      ++i;
      while (i < src_.size() && is_digit(src_[i])) ++i;
    }
    return i;
  }

  size_t match_exponent(size_t i) const {
    if (i >= src_.size() || (src_[i] != 'e' && src_[i] != 'E')) return std::string::npos;
    ++i;
    if (i < src_.size() && (src_[i] == '+' || src_[i] == '-')) ++i;
    return match_digits(i);
  }

  std::string digits_without_underscores(size_t i, size_t end) const {
    std::string s = src_.substr(i, end - i);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    return s;
  }

  size_t lex_float(size_t i) {
    if (i > 0 && src_[i - 1] == '.') return std::string::npos;
    size_t j = match_digits(i);
    if (j == std::string::npos) return std::string::npos;
    size_t end = std::string::npos;
    if (j < src_.size() && src_[j] == '.') {
      size_t f = match_digits(j + 1);
      if (f != std::string::npos) {
        size_t e = match_exponent(f);
        end = e != std::string::npos ? e : f;
      }
    }
    if (end == std::string::npos) end = match_exponent(j);
    if (end == std::string::npos) return std::string::npos;
    Token t;
    t.type = TokenType::kFloat;
    t.float_value = std::strtod(digits_without_underscores(i, end).c_str(), nullptr);
    t.pos = position(i);
    tokens_.push_back(std::move(t));
    return end;
  }

  size_t lex_integer(size_t i) {
    if (i >= src_.size() || !is_digit(src_[i])) return std::string::npos;
    auto run = [&](size_t j, auto is_valid) {
      size_t k = j;
      while (true) {
        size_t m = (k < src_.size() && src_[k] == '_') ? k + 1 : k;
        if (m < src_.size() && is_valid(src_[m])) {
          k = m + 1;
        } else {
          return k;
        }
      }
    };
    int base = 10;
    size_t digits_begin = i;
    size_t end;
    char p = i + 1 < src_.size() ? static_cast<char>(src_[i + 1] | 0x20) : 0;
    auto is_bin = [](char c) { return c == '0' || c == '1'; };
    auto is_oct = [](char c) { return c >= '0' && c <= '7'; };
    auto is_hex = [](char c) {
      return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    };
    if (src_[i] == '0' && (p == 'b' || p == 'o' || p == 'x') &&
        (end = run(i + 2, p == 'b'   ? +is_bin
                          : p == 'o' ? +is_oct
                                     : +is_hex)) > i + 2) {
      base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
      digits_begin = i + 2;
    } else if (src_[i] == '0') {
      end = run(i + 1, [](char c) { return c == '0'; });
    } else {
      end = run(i + 1, is_digit);
    }
    std::string digits = digits_without_underscores(digits_begin, end);
    errno = 0;
    unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) {
      number_error_ = error(i, "integer literal out of the supported 64-bit range");
    }
    Token t;
    t.type = TokenType::kInteger;
    t.int_value = static_cast<int64_t>(v);
    t.pos = position(i);
    tokens_.push_back(std::move(t));
    return end;
  }

  size_t find_string_end(size_t open) const {
    char quote = src_[open];
    for (size_t i = open + 1; i < src_.size(); ++i) {
      if (src_[i] == '\\') {
        ++i;
      } else if (src_[i] == quote) {
        return i;
      }
    }
    return std::string::npos;
  }

  // Python's unicode-escape decoding of a literal's body, as jinja2 applies it.
  Result<std::string> unescape(size_t begin, size_t end) const {
    std::string out;
    size_t i = begin;
    while (i < end) {
      char c = src_[i];
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          size_t k = 0;
          char32_t cp = 0;
          while (k < n && i + k < end && std::isxdigit(static_cast<unsigned char>(src_[i + k]))) {
            char h = src_[i + k];
            cp = cp * 16 + (is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
            ++k;
          }
          if (k < n) return error(i - 2, fmt::format("truncated \\{} escape in string literal", e));
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return error(i - 2, "illegal Unicode character in string literal");
          }
          append_utf8(out, cp);
          i += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = e - '0';
            for (int k = 0; k < 2 && i < end && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + (src_[i++] - '0');
            }
            append_utf8(out, cp);
          } else if (static_cast<unsigned char>(e) >= 0x80) {
            // jinja2 encodes the literal with backslashreplace first: the backslash escapes the
            // backslash of the \xNN / \uNNNN form, which then stays literal text.
            size_t n = (e & 0xE0) == 0xC0 ? 2 : (e & 0xF0) == 0xE0 ? 3 : 4;
            char32_t cp = utf8_decode(std::string_view(src_).substr(i - 1, n)).front();
            out += cp <= 0xFF     ? fmt::format("\\x{:02x}", static_cast<uint32_t>(cp))
                   : cp <= 0xFFFF ? fmt::format("\\u{:04x}", static_cast<uint32_t>(cp))
                                  : fmt::format("\\U{:08x}", static_cast<uint32_t>(cp));
            i += n - 1;
          } else if (e == 'N') {
            return error(i - 2, "\\N{...} escapes are not supported in string literals");
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    return out;
  }

  Result<size_t> lex_operator(size_t i, std::vector<char>* balance) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo) {
      if (src_.compare(i, 2, op) == 0) {
        push(TokenType::kOperator, std::string(op), i);
        return i + 2;
      }
    }
    char c = src_[i];
    static constexpr std::string_view kOne = "+-/*%~[](){}><=.:|,;";
    if (kOne.find(c) == std::string_view::npos) {
      std::u32string cp = utf8_decode(std::string_view(src_).substr(i, 4));
      std::string shown;
      append_utf8(shown, cp.front());
      return error(i, fmt::format("unexpected char '{}'", shown));
    }
    if (c == '(' || c == '[' || c == '{') {
      balance->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance->empty()) return error(i, fmt::format("unexpected '{}'", c));
      char expected = balance->back();
      balance->pop_back();
      if (expected != c)
        return error(i, fmt::format("unexpected '{}', expected '{}'", c, expected));
    }
    push(TokenType::kOperator, std::string(1, c), i);
    return i + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  Status number_error_;
  mutable int cache_line_ = 0;
  mutable size_t cache_offset_ = 0;
  mutable int cache_column_ = 1;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source) {
  if (!is_valid_utf8(source)) return invalid_argument("template source is not valid UTF-8");
  Lexer lexer(normalize_newlines(source));
  return lexer.run();
}

}  // namespace se::jinja
