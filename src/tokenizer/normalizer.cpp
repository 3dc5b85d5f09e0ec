#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "tokenizer/utf8.h"

namespace se {
namespace {

std::string unicode_form(std::string_view text, Normalizer::Form form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Normalizer::Form::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case Normalizer::Form::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case Normalizer::Form::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case Normalizer::Form::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) return std::string(text);  // only on invalid UTF-8, which callers never pass
  std::string out(reinterpret_cast<char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return out;
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t cp = utf8::next(text, pos);
    // Rust's char::to_lowercase (HF's Lowercase) applies the one unconditional multi-character
    // mapping of SpecialCasing.txt: U+0130 -> "i" + U+0307.
    if (cp == 0x130) {
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

std::string replace(std::string_view text, const Normalizer::Replace& step) {
  std::vector<Regex::Span> spans;
  if (!step.regex.empty()) {
    step.regex.front().find_all(text, spans);
  } else if (!step.literal.empty()) {
    for (size_t at = text.find(step.literal); at != std::string_view::npos;
         at = text.find(step.literal, at + step.literal.size())) {
      spans.emplace_back(at, at + step.literal.size());
    }
  }
  if (spans.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t prev = 0;
  for (const auto& [begin, end] : spans) {
    out.append(text.substr(prev, begin - prev));
    out += step.content;
    prev = end;
  }
  out.append(text.substr(prev));
  return out;
}

}  // namespace

std::string Normalizer::apply(std::string_view text) const {
  std::string current(text);
  for (const Step& step : steps_) {
    if (const auto* s = std::get_if<UnicodeForm>(&step)) {
      current = unicode_form(current, s->form);
    } else if (std::holds_alternative<Lowercase>(step)) {
      current = lowercase(current);
    } else if (const auto* r = std::get_if<Replace>(&step)) {
      current = replace(current, *r);
    } else if (const auto* p = std::get_if<Prepend>(&step)) {
      if (!current.empty()) current.insert(0, p->prefix);
    }
  }
  return current;
}

}  // namespace se
