// UTF-8 and Unicode helpers with Python `str` semantics: code-point indexing, str.isspace(),
// str.isprintable(), case mapping. Strings inside the interpreter are always valid UTF-8 (the
// template source and JSON inputs are validated on entry), so decoding never fails here. Stateless,
// thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "base/utf8_encode.h"

namespace se::jinja {

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool is_valid_utf8(std::string_view s);

// Decodes valid UTF-8 into code points.
std::u32string utf8_decode(std::string_view s);
// Encodes code points (one at a time: se::append_utf8).
std::string utf8_encode(std::u32string_view cps);
// Number of code points (Python len()).
size_t utf8_length(std::string_view s);
// Byte offset of the code point with index `cp_index`; s.size() when past the end.
size_t utf8_offset(std::string_view s, size_t cp_index);

// Python str.isspace() for one code point (Unicode White_Space plus the ASCII separators
// 0x1c-0x1f).
bool py_isspace(char32_t cp);
// Python str.isprintable() for one code point.
bool py_isprintable(char32_t cp);
bool py_isalnum(char32_t cp);
bool py_isalpha(char32_t cp);
bool py_isdigit(char32_t cp);
bool py_iscased(char32_t cp);
bool py_islower_cp(char32_t cp);
bool py_isupper_cp(char32_t cp);

// Python str.upper() / str.lower() / str.title() / str.capitalize() / str.swapcase().
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_title(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_swapcase(std::string_view s);
// Python str.islower() / str.isupper(): at least one cased character and no opposite-case ones.
bool py_islower(std::string_view s);
bool py_isupper(std::string_view s);

// Python str.strip(chars) family. `chars == nullptr` strips whitespace (py_isspace).
enum class StripSide { kLeft, kRight, kBoth };
std::string py_strip(std::string_view s, const std::string* chars, StripSide side);

}  // namespace se::jinja
