#include "tokenizer/utf8.h"

#include <utf8proc.h>

namespace se::utf8 {
namespace {

// Lead byte -> number of continuation bytes and the allowed range of the first one; need < 0
// marks a byte that cannot start a sequence.
struct LeadInfo {
  int need;
  uint8_t lo;
  uint8_t hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};  // excludes surrogates
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};  // up to U+10FFFF
  return {-1, 0, 0};
}

}  // namespace

char32_t next(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  const int need = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : 1;
  char32_t cp = b0 & (0x3F >> need);
  for (int i = 1; i <= need; ++i) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + i]) & 0x3F);
  pos += need + 1;
  return cp;
}

char32_t last(std::string_view text, size_t& start) {
  start = text.size() - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  size_t pos = start;
  return next(text, pos);
}

size_t append_lossy(std::string_view bytes, bool final, std::string& out) {
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    const LeadInfo info = lead_info(b);
    if (info.need < 0) {
      append_utf8(out, kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool broken = false;
    for (int k = 0; k < info.need; ++k, ++j) {
      if (j >= n) {
        if (!final) return i;
        append_utf8(out, kReplacement);
        return n;
      }
      const auto c = static_cast<uint8_t>(bytes[j]);
      const uint8_t lo = k == 0 ? info.lo : 0x80;
      const uint8_t hi = k == 0 ? info.hi : 0xBF;
      if (c < lo || c > hi) {
        broken = true;
        break;
      }
    }
    if (broken) {
      append_utf8(out, kReplacement);  // the offending byte starts the next round
    } else {
      out.append(bytes.substr(i, j - i));
    }
    i = j;
  }
  return n;
}

bool is_valid(std::string_view text) {
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const auto b = static_cast<uint8_t>(text[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const LeadInfo info = lead_info(b);
    if (info.need < 0 || i + static_cast<size_t>(info.need) >= n) return false;
    for (int k = 0; k < info.need; ++k) {
      const auto c = static_cast<uint8_t>(text[i + 1 + k]);
      const uint8_t lo = k == 0 ? info.lo : 0x80;
      const uint8_t hi = k == 0 ? info.hi : 0xBF;
      if (c < lo || c > hi) return false;
    }
    i += info.need + 1;
  }
  return true;
}

std::string sanitize(std::string_view text) {
  if (is_valid(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  append_lossy(text, /*final=*/true, out);
  return out;
}

bool is_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
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

bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace se::utf8
