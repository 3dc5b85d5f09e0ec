// SE_CHECK: invariants inside the engine. A failed check is a bug, never bad user input (that gets a Status):
// it prints the condition and a message, then aborts.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace se::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}

#define SE_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) [[unlikely]] {                                                          \
      ::se::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
    }                                                                                    \
  } while (0)

#ifndef NDEBUG
#define SE_DCHECK(cond, ...) SE_CHECK(cond, __VA_ARGS__)
#else
#define SE_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#endif
