// The API-key check: whether an Authorization header carries the server's key as "Bearer <key>". The comparison
// takes the same time wherever the first differing byte is, so response timing does not reveal the key a byte
// at a time. Pure function; thread-safe.
#pragma once

#include <string_view>

namespace se::server {

// True when `authorization` is "Bearer " followed by exactly `api_key`. An empty `api_key` never matches.
bool api_key_matches(std::string_view api_key, std::string_view authorization);

}  // namespace se::server
