// MethodConfig: reads a method's hyperparameters from the --sparse-config JSON object. Each read names its
// default and its valid range; finish() rejects keys no read asked for. resolved() is the full configuration
// the method runs with (defaults filled in), which `sparse-engine methods` prints.
#pragma once

#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace se {

class MethodConfig {
 public:
  // kInvalidArgument unless `config` is a JSON object (null counts as empty).
  static Result<MethodConfig> parse(const std::string& method, const nlohmann::json& config);

  Result<int> get_int(const std::string& key, int default_value, int min_value, int max_value);
  Result<double> get_double(const std::string& key, double default_value, double min_value, double max_value);
  Result<bool> get_bool(const std::string& key, bool default_value);
  Result<std::string> get_choice(const std::string& key, const std::string& default_value,
                                 std::initializer_list<const char*> choices);
  // A list of non-negative ints; an int key may also hold one number.
  Result<std::vector<int>> get_int_list(const std::string& key, const std::vector<int>& default_value,
                                        int max_value);

  // kInvalidArgument naming the first key that no get_* read.
  Status finish() const;
  const nlohmann::ordered_json& resolved() const { return resolved_; }

 private:
  MethodConfig(std::string method, nlohmann::json config) : method_(std::move(method)), config_(std::move(config)) {}
  const nlohmann::json* lookup(const std::string& key);

  std::string method_;
  nlohmann::json config_;
  std::set<std::string> read_;
  nlohmann::ordered_json resolved_ = nlohmann::ordered_json::object();
};

}  // namespace se
