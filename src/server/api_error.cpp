#include "server/api_error.h"

namespace se::server {

int http_status_for(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
    // The engine reports a request that can never fit in KV memory this way: the request is at fault.
    case StatusCode::kResourceExhausted: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kConflict: return 409;
    case StatusCode::kGone: return 410;
    case StatusCode::kUnimplemented: return 501;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDataLoss:
    case StatusCode::kAborted:
    case StatusCode::kInternal: return 500;
  }
  return 500;
}

std::string ApiError::type() const {
  switch (http_status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 408: return "RequestTimeoutError";
    case 409: return "ConflictError";
    case 410: return "GoneError";
    case 413: return "PayloadTooLargeError";
    case 501: return "NotImplementedError";
    case 503: return "ServiceUnavailableError";
    default: return http_status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

nlohmann::json ApiError::to_json() const {
  return {{"error",
           {{"message", message},
            {"type", type()},
            {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
            {"code", http_status}}}};
}

std::string ApiError::body() const {
  // Messages may quote user input: never let a stray byte make dump() throw.
  return to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError ApiError::from_status(const Status& status, std::string param) {
  return ApiError{http_status_for(status.code()), status.message(), std::move(param)};
}

ApiError ApiError::bad_request(std::string message, std::string param) {
  return ApiError{400, std::move(message), std::move(param)};
}

}  // namespace se::server
