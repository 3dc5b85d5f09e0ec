#include "chat/jinja/json_value.h"

#include "chat/jinja/unicode.h"

namespace se::jinja {
namespace {

template <typename Json>
Result<Value> convert(const Json& json, int depth_left) {
  if (depth_left < 0) return invalid_argument("JSON input nested too deeply");
  switch (json.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      auto u = json.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return invalid_argument("JSON integer {} exceeds the supported 64-bit range", u);
    }
    case nlohmann::json::value_t::number_float:
      return Value::floating(json.template get<double>());
    case nlohmann::json::value_t::string: {
      const auto& s = json.template get_ref<const std::string&>();
      if (!is_valid_utf8(s)) return invalid_argument("JSON string is not valid UTF-8");
      return Value::string(s);
    }
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) {
        SE_ASSIGN_OR_RETURN(Value v, convert(item, depth_left - 1));
        items.push_back(std::move(v));
      }
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      for (auto it = json.begin(); it != json.end(); ++it) {
        if (!is_valid_utf8(it.key())) return invalid_argument("JSON key is not valid UTF-8");
        SE_ASSIGN_OR_RETURN(Value v, convert(it.value(), depth_left - 1));
        dict.set(Value::string(it.key()), std::move(v));
      }
      return Value::dict(std::move(dict));
    }
    default:
      return invalid_argument("unsupported JSON value (binary or discarded)");
  }
}

}  // namespace

Result<Value> value_from_json(const nlohmann::ordered_json& json, int max_depth) {
  return convert(json, max_depth);
}

Result<Value> value_from_json(const nlohmann::json& json, int max_depth) {
  return convert(json, max_depth);
}

}  // namespace se::jinja
