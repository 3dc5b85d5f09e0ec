#include "chat/jinja/unicode.h"

#include <utf8proc.h>

#include <algorithm>

#include "chat/jinja/unicode_case_tables.h"

namespace se::jinja {
namespace {

utf8proc_category_t category(char32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

template <size_t N>
const detail::SpecialCase* find_special(const detail::SpecialCase (&table)[N], char32_t cp) {
  auto it = std::lower_bound(std::begin(table), std::end(table), cp,
                             [](const detail::SpecialCase& e, char32_t c) { return e.cp < c; });
  return (it != std::end(table) && it->cp == cp) ? it : nullptr;
}

template <size_t N>
void append_mapped(std::u32string& out, char32_t cp, const detail::SpecialCase (&table)[N],
                   utf8proc_int32_t (*simple)(utf8proc_int32_t)) {
  if (const detail::SpecialCase* special = find_special(table, cp)) {
    for (char32_t m : special->mapped) {
      if (m != 0) out.push_back(m);
    }
    return;
  }
  out.push_back(static_cast<char32_t>(simple(static_cast<utf8proc_int32_t>(cp))));
}

// Unicode Case_Ignorable, approximated from general categories plus the word-internal punctuation
// that Unicode lists explicitly; only used for the Greek final-sigma rule.
bool is_case_ignorable(char32_t cp) {
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      break;
  }
  switch (cp) {
    case 0x27:
    case 0x2E:
    case 0x3A:
    case 0xB7:
    case 0x387:
    case 0x5F4:
    case 0x2018:
    case 0x2019:
    case 0x2024:
    case 0x2027:
    case 0xFE13:
    case 0xFE52:
    case 0xFE55:
    case 0xFF07:
    case 0xFF0E:
    case 0xFF1A:
      return true;
    default:
      return false;
  }
}

// Python's lower() of one code point at index i, with the final-sigma context rule.
void append_lower_at(std::u32string& out, const std::u32string& s, size_t i) {
  char32_t c = s[i];
  if (c != 0x3A3) {
    append_mapped(out, c, detail::kLowerSpecial, utf8proc_tolower);
    return;
  }
  ptrdiff_t j = static_cast<ptrdiff_t>(i) - 1;
  while (j >= 0 && is_case_ignorable(s[j])) --j;
  bool final_sigma = j >= 0 && py_iscased(s[j]);
  if (final_sigma && i + 1 < s.size()) {
    size_t k = i + 1;
    while (k < s.size() && is_case_ignorable(s[k])) ++k;
    final_sigma = k == s.size() || !py_iscased(s[k]);
  }
  out.push_back(final_sigma ? 0x3C2 : 0x3C3);
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n;
    char32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t n = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : 3;
    char32_t cp = c & (n == 1 ? 0x1F : n == 2 ? 0x0F : 0x07);
    for (size_t k = 1; k <= n && i + k < s.size(); ++k) {
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    out.push_back(cp);
    i += n + 1;
  }
  return out;
}

std::string utf8_encode(std::u32string_view cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) append_utf8(out, cp);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  }
  return n;
}

size_t utf8_offset(std::string_view s, size_t cp_index) {
  size_t seen = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (seen == cp_index) return i;
      ++seen;
    }
  }
  return s.size();
}

bool py_isspace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool py_isprintable(char32_t cp) {
  if (cp == 0x20) return true;
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool py_isalpha(char32_t cp) {
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool py_isdigit(char32_t cp) { return category(cp) == UTF8PROC_CATEGORY_ND; }

bool py_isalnum(char32_t cp) {
  if (py_isalpha(cp)) return true;
  utf8proc_category_t c = category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool py_iscased(char32_t cp) {
  utf8proc_category_t c = category(cp);
  if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT)
    return true;
  auto i = static_cast<utf8proc_int32_t>(cp);
  return utf8proc_toupper(i) != i || utf8proc_tolower(i) != i;
}

bool py_islower_cp(char32_t cp) {
  auto i = static_cast<utf8proc_int32_t>(cp);
  return py_iscased(cp) && utf8proc_toupper(i) != i && category(cp) != UTF8PROC_CATEGORY_LT;
}

bool py_isupper_cp(char32_t cp) {
  auto i = static_cast<utf8proc_int32_t>(cp);
  return py_iscased(cp) && utf8proc_tolower(i) != i && category(cp) != UTF8PROC_CATEGORY_LT;
}

std::string py_upper(std::string_view s) {
  std::u32string out;
  for (char32_t c : utf8_decode(s)) append_mapped(out, c, detail::kUpperSpecial, utf8proc_toupper);
  return utf8_encode(out);
}

std::string py_lower(std::string_view s) {
  std::u32string in = utf8_decode(s);
  std::u32string out;
  for (size_t i = 0; i < in.size(); ++i) append_lower_at(out, in, i);
  return utf8_encode(out);
}

std::string py_title(std::string_view s) {
  std::u32string in = utf8_decode(s);
  std::u32string out;
  bool previous_is_cased = false;
  for (size_t i = 0; i < in.size(); ++i) {
    if (previous_is_cased) {
      append_lower_at(out, in, i);
    } else {
      append_mapped(out, in[i], detail::kTitleSpecial, utf8proc_totitle);
    }
    previous_is_cased = py_iscased(in[i]);
  }
  return utf8_encode(out);
}

std::string py_capitalize(std::string_view s) {
  std::u32string in = utf8_decode(s);
  std::u32string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 0) {
      append_mapped(out, in[i], detail::kTitleSpecial, utf8proc_totitle);
    } else {
      append_lower_at(out, in, i);
    }
  }
  return utf8_encode(out);
}

std::string py_swapcase(std::string_view s) {
  std::u32string in = utf8_decode(s);
  std::u32string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (py_isupper_cp(in[i])) {
      append_lower_at(out, in, i);
    } else if (py_islower_cp(in[i])) {
      append_mapped(out, in[i], detail::kUpperSpecial, utf8proc_toupper);
    } else {
      out.push_back(in[i]);
    }
  }
  return utf8_encode(out);
}

bool py_islower(std::string_view s) {
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (py_isupper_cp(c) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    if (py_islower_cp(c)) cased = true;
  }
  return cased;
}

bool py_isupper(std::string_view s) {
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (py_islower_cp(c) || category(c) == UTF8PROC_CATEGORY_LT) return false;
    if (py_isupper_cp(c)) cased = true;
  }
  return cased;
}

std::string py_strip(std::string_view s, const std::string* chars, StripSide side) {
  std::u32string in = utf8_decode(s);
  std::u32string set;
  if (chars != nullptr) set = utf8_decode(*chars);
  auto strip_it = [&](char32_t c) {
    return chars == nullptr ? py_isspace(c) : set.find(c) != std::u32string::npos;
  };
  size_t begin = 0;
  size_t end = in.size();
  if (side != StripSide::kRight) {
    while (begin < end && strip_it(in[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strip_it(in[end - 1])) --end;
  }
  return utf8_encode(std::u32string_view(in).substr(begin, end - begin));
}

}  // namespace se::jinja
