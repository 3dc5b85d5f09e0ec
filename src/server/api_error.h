// ApiError: an OpenAI-shaped error response ({"error": {"message", "type", "param", "code"}}) with its HTTP
// status, and the one place where Status codes map to HTTP statuses. ApiResult<T> holds a value or the ApiError
// to answer with. Plain values; thread-safe to copy.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <variant>

#include "base/status.h"

namespace se::server {

// The HTTP status a Status code answers with: 400 for bad input (invalid, out of range, unsatisfiable resource
// requests), 404 not found, 501 unimplemented, 503 unavailable, 500 for the rest.
int http_status_for(StatusCode code);

struct ApiError {
  int http_status = 500;
  std::string message;
  std::string param;  // the request field at fault; empty -> null

  // "BadRequestError", "NotFoundError", ... (the exception names OpenAI clients raise, as vLLM sends them).
  std::string type() const;
  nlohmann::json to_json() const;
  // The serialized body, ready to send.
  std::string body() const;

  static ApiError from_status(const Status& status, std::string param = "");
  static ApiError bad_request(std::string message, std::string param = "");
};

// A value or the ApiError to send back; mirrors se::Result for the HTTP layer.
template <typename T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(T value) : data_(std::move(value)) {}     // NOLINT: implicit by design
  ApiResult(ApiError error) : data_(std::move(error)) {}  // NOLINT: implicit by design

  bool is_ok() const { return std::holds_alternative<T>(data_); }
  // Precondition: is_ok().
  T& value() & { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  const T& value() const& { return std::get<T>(data_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  // Precondition: !is_ok().
  const ApiError& error() const { return std::get<ApiError>(data_); }

 private:
  std::variant<T, ApiError> data_;
};

}  // namespace se::server

// SE_API_ASSIGN_OR_RETURN(auto x, parse_x()); returns the ApiError from the enclosing function on failure.
#define SE_API_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.is_ok()) return tmp.error();              \
  lhs = std::move(tmp).value()
#define SE_API_ASSIGN_OR_RETURN(lhs, expr) \
  SE_API_ASSIGN_OR_RETURN_IMPL(SE_CONCAT(se_api_result_, __LINE__), lhs, expr)
