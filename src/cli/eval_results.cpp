#include "cli/eval_results.h"

#include <filesystem>

namespace se::cli {

Result<ResultsFile> ResultsFile::open(const std::string& path) {
  ResultsFile file;
  file.path_ = path;
  if (path.empty()) return file;
  if (std::filesystem::exists(path)) {
    std::ifstream in(path);
    if (!in) return not_found("--results '{}': cannot be read", path);
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      if (line.empty()) continue;
      nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_discarded() || !record.is_object() || !record.contains("cell") || !record.contains("result") ||
          !record["cell"].is_object())
        return invalid_argument("--results '{}': line {} is not a cell record", path, number);
      nlohmann::json& cell = record["cell"];
      if (!cell.contains("kv_cache_dtype")) cell["kv_cache_dtype"] = "auto";  // from before stores were evaluated
      file.results_[cell.dump()] = {cell, record["result"]};
    }
  }
  file.out_ = std::make_unique<std::ofstream>(path, std::ios::app);
  if (!*file.out_) return invalid_argument("--results '{}': cannot be written", path);
  return file;
}

const nlohmann::json* ResultsFile::find(const nlohmann::json& cell) const {
  auto it = results_.find(cell.dump());
  return it == results_.end() ? nullptr : &it->second.second;
}

Status ResultsFile::append(const nlohmann::json& cell, const nlohmann::json& result) {
  const std::string key = cell.dump();
  if (results_.contains(key)) return internal_error("results: cell {} is already recorded", key);
  results_[key] = {cell, result};
  if (out_) {
    *out_ << nlohmann::json{{"cell", cell}, {"result", result}}.dump() << '\n';
    out_->flush();
    if (!*out_) return internal_error("--results '{}': write failed", path_);
  }
  return Status::ok();
}

std::vector<nlohmann::json> ResultsFile::records() const {
  std::vector<nlohmann::json> out;
  for (const auto& [key, value] : results_) out.push_back({{"cell", value.first}, {"result", value.second}});
  return out;
}

}  // namespace se::cli
