#include "server/api_key.h"

#include <cstddef>

namespace se::server {

namespace {

constexpr std::string_view kBearer = "Bearer ";

// Compares every byte of `expected` whatever the outcome; the time depends only on expected's length (the
// server's own, not the guess's).
bool constant_time_equal(std::string_view expected, std::string_view given) {
  unsigned char diff = expected.size() == given.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(static_cast<unsigned char>(expected[i]) ^ g);
  }
  return diff == 0;
}

}  // namespace

bool api_key_matches(std::string_view api_key, std::string_view authorization) {
  if (api_key.empty() || authorization.substr(0, kBearer.size()) != kBearer) return false;
  return constant_time_equal(api_key, authorization.substr(kBearer.size()));
}

}  // namespace se::server
