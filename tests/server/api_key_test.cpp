#include "server/api_key.h"

#include <gtest/gtest.h>

namespace se::server {
namespace {

TEST(ApiKeyMatches, NeedsTheBearerSchemeAndTheExactKey) {
  EXPECT_TRUE(api_key_matches("s3cret", "Bearer s3cret"));
  EXPECT_FALSE(api_key_matches("s3cret", "Bearer s3cre"));     // a prefix
  EXPECT_FALSE(api_key_matches("s3cret", "Bearer s3cret2"));   // longer
  EXPECT_FALSE(api_key_matches("s3cret", "Bearer s3creT"));    // last byte differs
  EXPECT_FALSE(api_key_matches("s3cret", "Bearer "));
  EXPECT_FALSE(api_key_matches("s3cret", "s3cret"));           // no scheme
  EXPECT_FALSE(api_key_matches("s3cret", "Basic s3cret"));
  EXPECT_FALSE(api_key_matches("s3cret", ""));
  EXPECT_FALSE(api_key_matches("", "Bearer "));                // no key configured never matches
  EXPECT_TRUE(api_key_matches(std::string_view("a\0b", 3), std::string_view("Bearer a\0b", 10)));
  EXPECT_FALSE(api_key_matches(std::string_view("a\0b", 3), "Bearer a"));
}

}  // namespace
}  // namespace se::server
