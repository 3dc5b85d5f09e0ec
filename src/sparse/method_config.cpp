#include "sparse/method_config.h"

namespace se {

Result<MethodConfig> MethodConfig::parse(const std::string& method, const nlohmann::json& config) {
  if (config.is_null()) return MethodConfig(method, nlohmann::json::object());
  if (!config.is_object())
    return invalid_argument("--sparse-config for {} must be a JSON object, got {}", method, config.dump());
  return MethodConfig(method, config);
}

const nlohmann::json* MethodConfig::lookup(const std::string& key) {
  read_.insert(key);
  auto it = config_.find(key);
  return it == config_.end() ? nullptr : &*it;
}

Result<int> MethodConfig::get_int(const std::string& key, int default_value, int min_value, int max_value) {
  int value = default_value;
  if (const nlohmann::json* v = lookup(key)) {
    if (!v->is_number_integer())
      return invalid_argument("{}: '{}' must be an integer, got {}", method_, key, v->dump());
    const int64_t raw = v->get<int64_t>();
    if (raw < min_value || raw > max_value)
      return invalid_argument("{}: '{}' = {} is out of range [{}, {}]", method_, key, raw, min_value, max_value);
    value = static_cast<int>(raw);
  }
  resolved_[key] = value;
  return value;
}

Result<double> MethodConfig::get_double(const std::string& key, double default_value, double min_value,
                                        double max_value) {
  double value = default_value;
  if (const nlohmann::json* v = lookup(key)) {
    if (!v->is_number()) return invalid_argument("{}: '{}' must be a number, got {}", method_, key, v->dump());
    value = v->get<double>();
    if (!(value >= min_value && value <= max_value))
      return invalid_argument("{}: '{}' = {} is out of range [{}, {}]", method_, key, value, min_value, max_value);
  }
  resolved_[key] = value;
  return value;
}

Result<bool> MethodConfig::get_bool(const std::string& key, bool default_value) {
  bool value = default_value;
  if (const nlohmann::json* v = lookup(key)) {
    if (!v->is_boolean()) return invalid_argument("{}: '{}' must be true or false, got {}", method_, key, v->dump());
    value = v->get<bool>();
  }
  resolved_[key] = value;
  return value;
}

Result<std::string> MethodConfig::get_choice(const std::string& key, const std::string& default_value,
                                             std::initializer_list<const char*> choices) {
  std::string value = default_value;
  if (const nlohmann::json* v = lookup(key)) {
    std::string allowed;
    bool ok = false;
    for (const char* c : choices) {
      allowed += (allowed.empty() ? "" : ", ") + std::string(c);
      ok = ok || (v->is_string() && v->get<std::string>() == c);
    }
    if (!ok) return invalid_argument("{}: '{}' must be one of {}, got {}", method_, key, allowed, v->dump());
    value = v->get<std::string>();
  }
  resolved_[key] = value;
  return value;
}

Result<std::vector<int>> MethodConfig::get_int_list(const std::string& key, const std::vector<int>& default_value,
                                                    int max_value) {
  std::vector<int> value = default_value;
  if (const nlohmann::json* v = lookup(key)) {
    const nlohmann::json list = v->is_array() ? *v : nlohmann::json::array({*v});
    value.clear();
    for (const nlohmann::json& item : list) {
      if (!item.is_number_integer() || item.get<int64_t>() < 0 || item.get<int64_t>() > max_value)
        return invalid_argument("{}: '{}' must hold integers in [0, {}], got {}", method_, key, max_value,
                                v->dump());
      value.push_back(item.get<int>());
    }
  }
  resolved_[key] = value;
  return value;
}

Status MethodConfig::finish() const {
  for (const auto& [key, value] : config_.items())
    if (read_.count(key) == 0) {
      std::string known;
      for (const std::string& k : read_) known += (known.empty() ? "" : ", ") + k;
      return invalid_argument("{}: unknown --sparse-config key '{}' (known: {})", method_, key,
                              known.empty() ? "none" : known);
    }
  return Status::ok();
}

}  // namespace se
