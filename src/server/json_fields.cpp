#include "server/json_fields.h"

#include <fmt/format.h>

#include <limits>

namespace se::server {

namespace {

// Reads an integer JSON value into int64; false when it does not fit.
bool to_int64(const nlohmann::json& value, int64_t& out) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  out = value.get<int64_t>();
  return true;
}

}  // namespace

std::string json_type_name(const nlohmann::json& value) {
  if (value.is_string()) return "string";
  if (value.is_number_integer()) return "integer";
  if (value.is_number()) return "number";
  if (value.is_boolean()) return "boolean";
  if (value.is_array()) return "array";
  if (value.is_object()) return "object";
  return "null";
}

const nlohmann::json* FieldReader::find(std::string_view key) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string FieldReader::field_name(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

ApiError FieldReader::type_error(std::string_view key, std::string_view expected, const nlohmann::json& got) const {
  const std::string name = field_name(key);
  return ApiError::bad_request(fmt::format("'{}' must be {}, got {}", name, expected, json_type_name(got)), name);
}

ApiResult<std::optional<int64_t>> FieldReader::get_int(std::string_view key, int64_t min, int64_t max) const {
  const nlohmann::json* value = find(key);
  if (!value) return std::optional<int64_t>();
  if (!value->is_number_integer()) return type_error(key, "an integer", *value);
  int64_t v = 0;
  if (!to_int64(*value, v) || v < min || v > max) {
    const std::string name = field_name(key);
    return ApiError::bad_request(
        fmt::format("'{}' must be an integer in [{}, {}], got {}", name, min, max, value->dump()), name);
  }
  return std::optional<int64_t>(v);
}

ApiResult<std::optional<double>> FieldReader::get_number(std::string_view key) const {
  const nlohmann::json* value = find(key);
  if (!value) return std::optional<double>();
  if (!value->is_number()) return type_error(key, "a number", *value);
  return std::optional<double>(value->get<double>());
}

ApiResult<std::optional<bool>> FieldReader::get_bool(std::string_view key) const {
  const nlohmann::json* value = find(key);
  if (!value) return std::optional<bool>();
  if (!value->is_boolean()) return type_error(key, "a boolean", *value);
  return std::optional<bool>(value->get<bool>());
}

ApiResult<std::optional<std::string>> FieldReader::get_string(std::string_view key) const {
  const nlohmann::json* value = find(key);
  if (!value) return std::optional<std::string>();
  if (!value->is_string()) return type_error(key, "a string", *value);
  return std::optional<std::string>(value->get<std::string>());
}

ApiResult<std::vector<std::string>> FieldReader::get_string_or_list(std::string_view key) const {
  const nlohmann::json* value = find(key);
  std::vector<std::string> out;
  if (!value) return out;
  if (value->is_string()) {
    out.push_back(value->get<std::string>());
    return out;
  }
  if (!value->is_array()) return type_error(key, "a string or a list of strings", *value);
  for (const nlohmann::json& item : *value) {
    if (!item.is_string()) return type_error(key, "a string or a list of strings", item);
    out.push_back(item.get<std::string>());
  }
  return out;
}

ApiResult<std::vector<int64_t>> FieldReader::get_int_list(std::string_view key, int64_t min, int64_t max) const {
  const nlohmann::json* value = find(key);
  std::vector<int64_t> out;
  if (!value) return out;
  if (!value->is_array()) return type_error(key, "a list of integers", *value);
  for (const nlohmann::json& item : *value) {
    int64_t v = 0;
    if (!item.is_number_integer()) return type_error(key, "a list of integers", item);
    if (!to_int64(item, v) || v < min || v > max) {
      const std::string name = field_name(key);
      return ApiError::bad_request(
          fmt::format("'{}' items must be integers in [{}, {}], got {}", name, min, max, item.dump()), name);
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace se::server
