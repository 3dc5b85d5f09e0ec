// Python str methods on UTF-8 strings with code-point indices: replace, split/rsplit, splitlines,
// find/count with slice bounds, padding. Used by the str methods and the string filters. Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace se::jinja {

// str.replace(old, new, count); count < 0 replaces all. An empty `old` inserts between characters.
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl,
                       int64_t count);
// str.split(sep, maxsplit) / str.rsplit; `sep == nullptr` splits on whitespace runs.
// Precondition: sep is not empty (callers raise ValueError first).
std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);

// Python slice-bound normalization of [start, end) over `length` code points.
void py_adjust_bounds(std::optional<int64_t> start, std::optional<int64_t> end, int64_t length,
                      int64_t* begin_out, int64_t* end_out);
// str.find / str.rfind within code points [begin, end): index or -1.
int64_t py_find(const std::u32string& s, const std::u32string& sub, int64_t begin, int64_t end,
                bool reverse);
// str.count within code points [begin, end).
int64_t py_count(const std::u32string& s, const std::u32string& sub, int64_t begin, int64_t end);

// str.center / str.ljust / str.rjust with a one-character fill.
std::string py_center(std::string_view s, int64_t width, char32_t fill);
std::string py_ljust(std::string_view s, int64_t width, char32_t fill);
std::string py_rjust(std::string_view s, int64_t width, char32_t fill);

}  // namespace se::jinja
