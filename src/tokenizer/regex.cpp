#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "base/logging.h"

namespace se {
namespace {

// Unicode White_Space, as a character-class body.
constexpr std::string_view kWhiteSpaceBody =
    "\\t-\\r "
    "\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// PCRE2's UCP \s also covers U+180E and a few controls that Oniguruma's does not; spell it out.
std::string rewrite_space_classes(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceBody) : "[" + std::string(kWhiteSpaceBody) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceBody) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t close = pattern.find(":]", i + 2);
      if (close != std::string_view::npos) {
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per-thread match state: a one-pair match block and a JIT stack larger than the 32 KiB default,
// so long runs of whitespace or letters do not hit the JIT stack limit.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(size_t{64} << 10, size_t{8} << 20, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);

  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

size_t char_length_at(std::string_view text, size_t pos) {
  size_t n = 1;
  while (pos + n < text.size() && (static_cast<uint8_t>(text[pos + n]) & 0xC0) == 0x80) ++n;
  return n;
}

}  // namespace

Result<Regex> Regex::compile(std::string_view pattern) {
  const std::string rewritten = rewrite_space_classes(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code,
                                   &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return invalid_argument("regex '{}': {} at offset {}", pattern,
                            reinterpret_cast<char*>(message), error_offset);
  }
  // JIT is an optimization: without it pcre2_match interprets the same pattern.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  Regex regex;
  regex.pattern_ = std::string(pattern);
  regex.code_ =
      std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
  return regex;
}

void Regex::find_all(std::string_view text, std::vector<Span>& matches) const {
  ThreadMatchState& state = thread_match_state();
  const auto* code = static_cast<const pcre2_code*>(code_.get());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (search_from <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), search_from, PCRE2_NO_UTF_CHECK,
                               state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      SE_LOG_WARN("regex '{}': match error {} at offset {}; keeping the rest as one piece",
                  pattern_, rc, search_from);
      if (search_from < text.size()) matches.emplace_back(search_from, text.size());
      return;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end && have_last && last_match_end == end) {
      if (search_from >= text.size()) return;
      search_from += char_length_at(text, search_from);
      continue;
    }
    matches.emplace_back(begin, end);
    have_last = true;
    last_match_end = end;
    search_from = end;
  }
}

}  // namespace se
