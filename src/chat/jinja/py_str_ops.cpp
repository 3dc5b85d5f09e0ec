#include "chat/jinja/py_str_ops.h"

#include <algorithm>

#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

bool is_line_break(char32_t c) {
  switch (c) {
    case '\n':
    case '\r':
    case 0x0B:
    case 0x0C:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x85:
    case 0x2028:
    case 0x2029:
      return true;
    default:
      return false;
  }
}

std::string fill_string(char32_t fill, int64_t n) {
  std::string out;
  for (int64_t i = 0; i < n; ++i) append_utf8(out, fill);
  return out;
}

}  // namespace

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` before every character and at the end, up to `count` times.
    std::u32string cps = utf8_decode(s);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      append_utf8(out, c);
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(repl);
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep != nullptr) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      parts.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    parts.emplace_back(s.substr(pos));
    return parts;
  }
  std::u32string cps = utf8_decode(s);
  size_t i = 0;
  const size_t n = cps.size();
  while (true) {
    while (i < n && py_isspace(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(utf8_encode(std::u32string_view(cps).substr(i)));
      break;
    }
    size_t j = i;
    while (j < n && !py_isspace(cps[j])) ++j;
    parts.push_back(utf8_encode(std::u32string_view(cps).substr(i, j - i)));
    i = j;
  }
  return parts;
}

std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep != nullptr) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  std::u32string cps = utf8_decode(s);
  size_t j = cps.size();
  while (true) {
    while (j > 0 && py_isspace(cps[j - 1])) --j;
    if (j == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(utf8_encode(std::u32string_view(cps).substr(0, j)));
      break;
    }
    size_t i = j;
    while (i > 0 && !py_isspace(cps[i - 1])) --i;
    parts.push_back(utf8_encode(std::u32string_view(cps).substr(i, j - i)));
    j = i;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  std::u32string cps = utf8_decode(s);
  std::vector<std::string> lines;
  size_t i = 0;
  const size_t n = cps.size();
  while (i < n) {
    size_t j = i;
    while (j < n && !is_line_break(cps[j])) ++j;
    size_t eol = j;
    if (j < n) {
      eol = (cps[j] == '\r' && j + 1 < n && cps[j + 1] == '\n') ? j + 2 : j + 1;
    }
    lines.push_back(utf8_encode(std::u32string_view(cps).substr(i, (keepends ? eol : j) - i)));
    i = eol;
  }
  return lines;
}

void py_adjust_bounds(std::optional<int64_t> start, std::optional<int64_t> end, int64_t length,
                      int64_t* begin_out, int64_t* end_out) {
  auto adjust = [length](int64_t v) {
    if (v < 0) v = std::max<int64_t>(0, v + length);
    return std::min(v, length);
  };
  *begin_out = start ? (*start < 0 ? adjust(*start) : *start) : 0;
  *end_out = end ? adjust(*end) : length;
}

int64_t py_find(const std::u32string& s, const std::u32string& sub, int64_t begin, int64_t end,
                bool reverse) {
  const auto length = static_cast<int64_t>(s.size());
  if (begin > length || end - begin < static_cast<int64_t>(sub.size())) return -1;
  std::u32string_view window =
      std::u32string_view(s).substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
  size_t hit = reverse ? window.rfind(sub) : window.find(sub);
  return hit == std::u32string_view::npos ? -1 : begin + static_cast<int64_t>(hit);
}

int64_t py_count(const std::u32string& s, const std::u32string& sub, int64_t begin, int64_t end) {
  const auto length = static_cast<int64_t>(s.size());
  if (begin > length || end < begin) return 0;
  if (sub.empty()) return end - begin + 1;
  std::u32string_view window =
      std::u32string_view(s).substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
  int64_t n = 0;
  for (size_t pos = window.find(sub); pos != std::u32string_view::npos;
       pos = window.find(sub, pos + sub.size())) {
    ++n;
  }
  return n;
}

std::string py_center(std::string_view s, int64_t width, char32_t fill) {
  const auto len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return std::string(s);
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  return fill_string(fill, left) + std::string(s) + fill_string(fill, marg - left);
}

std::string py_ljust(std::string_view s, int64_t width, char32_t fill) {
  const auto len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return std::string(s);
  return std::string(s) + fill_string(fill, width - len);
}

std::string py_rjust(std::string_view s, int64_t width, char32_t fill) {
  const auto len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return std::string(s);
  return fill_string(fill, width - len) + std::string(s);
}

}  // namespace se::jinja
