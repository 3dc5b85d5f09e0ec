// Status and Result<T>: the error type at every module boundary.
// A Status is a code plus a message that names the input and what was wrong; Result<T> holds a value or a Status.
// Both are plain values, safe to move between threads.
#pragma once

#include <fmt/format.h>

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace se {

enum class StatusCode {
  kOk,
  kInvalidArgument,    // the caller's input is malformed or out of range
  kNotFound,           // a named file, tensor, key or model does not exist
  kOutOfRange,         // an index or length beyond a limit (e.g. prompt over max-model-len)
  kDataLoss,           // a file is truncated or corrupted
  kUnimplemented,      // a valid input this build does not support (e.g. an unknown quant type)
  kResourceExhausted,  // not enough memory or capacity
  kFailedPrecondition, // the system is not in a state that allows the call
  kUnavailable,        // temporarily unable (shutting down, busy)
  kAborted,            // cancelled by the caller
  kConflict,           // the named thing is in a state that conflicts with the request (busy, other contents)
  kGone,               // the named thing existed but was reclaimed
  kInternal,           // a broken invariant inside the engine
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message"
  std::string to_string() const;

  // Returns a copy with "context: " prepended to the message, e.g. the file being parsed.
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
#define SE_STATUS_FACTORY(fn, code)                                     \
  template <typename... Args>                                           \
  Status fn(fmt::format_string<Args...> f, Args&&... args) {            \
    return Status(StatusCode::code, fmt::format(f, std::forward<Args>(args)...)); \
  }
SE_STATUS_FACTORY(invalid_argument, kInvalidArgument)
SE_STATUS_FACTORY(not_found, kNotFound)
SE_STATUS_FACTORY(out_of_range, kOutOfRange)
SE_STATUS_FACTORY(data_loss, kDataLoss)
SE_STATUS_FACTORY(unimplemented, kUnimplemented)
SE_STATUS_FACTORY(resource_exhausted, kResourceExhausted)
SE_STATUS_FACTORY(failed_precondition, kFailedPrecondition)
SE_STATUS_FACTORY(unavailable, kUnavailable)
SE_STATUS_FACTORY(aborted, kAborted)
SE_STATUS_FACTORY(conflict, kConflict)
SE_STATUS_FACTORY(gone, kGone)
SE_STATUS_FACTORY(internal_error, kInternal)
#undef SE_STATUS_FACTORY

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(data_).is_ok() && "Result built from an ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return is_ok(); }

  // Precondition: is_ok().
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  // The error, or ok() when a value is held.
  Status status() const { return is_ok() ? Status::ok() : std::get<Status>(data_); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace se

#define SE_CONCAT_INNER(a, b) a##b
#define SE_CONCAT(a, b) SE_CONCAT_INNER(a, b)

#define SE_RETURN_IF_ERROR(expr)         \
  do {                                   \
    ::se::Status se_status_ = (expr);    \
    if (!se_status_.is_ok()) return se_status_; \
  } while (0)

#define SE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

// SE_ASSIGN_OR_RETURN(auto x, make_x()); returns the error from the enclosing function on failure.
#define SE_ASSIGN_OR_RETURN(lhs, expr) \
  SE_ASSIGN_OR_RETURN_IMPL(SE_CONCAT(se_result_, __LINE__), lhs, expr)
