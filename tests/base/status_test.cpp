#include "base/status.h"

#include <gtest/gtest.h>

namespace se {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument("x must be positive, got {}", x);
  return x;
}

Result<int> twice_positive(int x) {
  SE_ASSIGN_OR_RETURN(int v, parse_positive(x));
  return 2 * v;
}

TEST(StatusTest, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(Status::ok().is_ok());
  Status s = not_found("{}: missing", "model.gguf");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "NOT_FOUND: model.gguf: missing");
  EXPECT_EQ(s.with_context("loading").message(), "loading: model.gguf: missing");
}

TEST(StatusTest, AssignOrReturnPropagates) {
  EXPECT_EQ(twice_positive(3).value(), 6);
  Result<int> r = twice_positive(-1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("-1"), std::string::npos);
}

}  // namespace
}  // namespace se
