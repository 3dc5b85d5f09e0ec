// Typed, validated reads of config.json fields. Every error names the key and what was wrong.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace se::config_json {

// Required positive integer.
Result<int> positive_int(const nlohmann::json& j, const char* key);
// Optional integer (absent or null -> fallback).
Result<int> int_or(const nlohmann::json& j, const char* key, int fallback);
// Optional float (absent or null -> fallback).
Result<float> float_or(const nlohmann::json& j, const char* key, float fallback);
Result<bool> bool_or(const nlohmann::json& j, const char* key, bool fallback);
Result<std::string> string_or(const nlohmann::json& j, const char* key, const std::string& fallback);

}  // namespace se::config_json
