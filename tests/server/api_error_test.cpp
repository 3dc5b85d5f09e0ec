#include "server/api_error.h"

#include <gtest/gtest.h>

namespace se::server {
namespace {

TEST(HttpStatusFor, MapsEveryStatusCode) {
  EXPECT_EQ(http_status_for(StatusCode::kOk), 200);
  EXPECT_EQ(http_status_for(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(http_status_for(StatusCode::kOutOfRange), 400);
  EXPECT_EQ(http_status_for(StatusCode::kFailedPrecondition), 400);
  EXPECT_EQ(http_status_for(StatusCode::kResourceExhausted), 400);
  EXPECT_EQ(http_status_for(StatusCode::kNotFound), 404);
  EXPECT_EQ(http_status_for(StatusCode::kUnimplemented), 501);
  EXPECT_EQ(http_status_for(StatusCode::kUnavailable), 503);
  EXPECT_EQ(http_status_for(StatusCode::kDataLoss), 500);
  EXPECT_EQ(http_status_for(StatusCode::kAborted), 500);
  EXPECT_EQ(http_status_for(StatusCode::kInternal), 500);
}

TEST(ApiError, HasTheOpenAiShape) {
  const ApiError error = ApiError::bad_request("'n' must be in [1, 8], got 9", "n");
  const nlohmann::json body = nlohmann::json::parse(error.body());
  EXPECT_EQ(body, nlohmann::json::parse(R"({"error": {"message": "'n' must be in [1, 8], got 9",
                                                      "type": "BadRequestError", "param": "n", "code": 400}})"));
}

TEST(ApiError, NamesAuthenticationAndTimeoutErrorsAsOpenAiClientsDo) {
  EXPECT_EQ((ApiError{401, "no key", ""}.type()), "AuthenticationError");
  EXPECT_EQ((ApiError{408, "too slow", "timeout"}.type()), "RequestTimeoutError");
}

TEST(ApiError, FromStatusKeepsTheMessageAndLeavesParamNull) {
  const ApiError error = ApiError::from_status(unavailable("the engine is shutting down"));
  EXPECT_EQ(error.http_status, 503);
  const nlohmann::json body = error.to_json();
  EXPECT_EQ(body["error"]["message"], "the engine is shutting down");
  EXPECT_EQ(body["error"]["type"], "ServiceUnavailableError");
  EXPECT_TRUE(body["error"]["param"].is_null());
  EXPECT_EQ(body["error"]["code"], 503);
  EXPECT_EQ(ApiError::from_status(not_found("x")).type(), "NotFoundError");
  EXPECT_EQ(ApiError::from_status(internal_error("x")).type(), "InternalServerError");
}

TEST(ApiError, BodySurvivesInvalidUtf8InTheMessage) {
  const ApiError error = ApiError::bad_request("unknown model \xFF\xFE");
  const std::string body = error.body();
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(parsed.is_discarded()) << body;
  EXPECT_NE(parsed["error"]["message"].get<std::string>().find("unknown model"), std::string::npos);
}

}  // namespace
}  // namespace se::server
