#include "model/config_json.h"

namespace se::config_json {

namespace {
bool absent(const nlohmann::json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }
}  // namespace

Result<int> positive_int(const nlohmann::json& j, const char* key) {
  if (absent(j, key)) return invalid_argument("config: missing required key '{}'", key);
  SE_ASSIGN_OR_RETURN(int v, int_or(j, key, 0));
  if (v <= 0) return invalid_argument("config: '{}' must be positive, got {}", key, v);
  return v;
}

Result<int> int_or(const nlohmann::json& j, const char* key, int fallback) {
  if (absent(j, key)) return fallback;
  const auto& v = j[key];
  if (!v.is_number_integer()) return invalid_argument("config: '{}' must be an integer, got {}", key, v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < INT32_MIN || x > INT32_MAX) return invalid_argument("config: '{}' out of range: {}", key, x);
  return static_cast<int>(x);
}

Result<float> float_or(const nlohmann::json& j, const char* key, float fallback) {
  if (absent(j, key)) return fallback;
  const auto& v = j[key];
  if (!v.is_number()) return invalid_argument("config: '{}' must be a number, got {}", key, v.dump());
  return v.get<float>();
}

Result<bool> bool_or(const nlohmann::json& j, const char* key, bool fallback) {
  if (absent(j, key)) return fallback;
  const auto& v = j[key];
  if (!v.is_boolean()) return invalid_argument("config: '{}' must be a boolean, got {}", key, v.dump());
  return v.get<bool>();
}

Result<std::string> string_or(const nlohmann::json& j, const char* key, const std::string& fallback) {
  if (absent(j, key)) return fallback;
  const auto& v = j[key];
  if (!v.is_string()) return invalid_argument("config: '{}' must be a string, got {}", key, v.dump());
  return v.get<std::string>();
}

}  // namespace se::config_json
