// FieldReader: typed reads of optional fields of a request's JSON object. An absent or null field reads as
// nullopt (OpenAI clients send null for "not given"); a field of the wrong type or outside its range is an
// ApiError (400) whose message and param name the field. Unknown fields are never looked at. Stateless besides
// the borrowed object; thread-compatible.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace se::server {

// "string", "integer", "number", "boolean", "array", "object" or "null": how error messages name a JSON type.
std::string json_type_name(const nlohmann::json& value);

class FieldReader {
 public:
  // `object` must outlive the reader; `path` prefixes field names in errors (e.g. "stream_options").
  explicit FieldReader(const nlohmann::json& object, std::string path = "")
      : object_(object), path_(std::move(path)) {}

  // The field, or nullptr when absent or null.
  const nlohmann::json* find(std::string_view key) const;
  // The field's name as errors spell it: "stream_options.include_usage".
  std::string field_name(std::string_view key) const;

  ApiResult<std::optional<int64_t>> get_int(std::string_view key, int64_t min, int64_t max) const;
  ApiResult<std::optional<double>> get_number(std::string_view key) const;
  ApiResult<std::optional<bool>> get_bool(std::string_view key) const;
  ApiResult<std::optional<std::string>> get_string(std::string_view key) const;
  // A string or a list of strings (e.g. "stop").
  ApiResult<std::vector<std::string>> get_string_or_list(std::string_view key) const;
  // A list of integers in [min, max] (e.g. "stop_token_ids").
  ApiResult<std::vector<int64_t>> get_int_list(std::string_view key, int64_t min, int64_t max) const;

  // 400 naming the field: "'<field>' must be <expected>, got <type>".
  ApiError type_error(std::string_view key, std::string_view expected, const nlohmann::json& got) const;

 private:
  const nlohmann::json& object_;
  std::string path_;
};

}  // namespace se::server
