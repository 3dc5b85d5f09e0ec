// ResultsFile: the resumable results of `sparse-engine eval`, one JSON line per finished cell. A cell is one
// (model, method, budget, KV store, task, context length, sample) under one configuration (method config, task
// parameters); its line holds {"cell": {...}, "result": {...}}. A rerun opens the same file, skips every cell
// whose exact cell object (configuration included) is already there, and appends the rest, so a stopped sweep
// keeps its finished cells and a changed configuration is run afresh. A cell written before cells named their
// store (no "kv_cache_dtype") reads as the explicit store's, "auto". Lines are flushed one by one. Not
// thread-safe.
#pragma once

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace se::cli {

class ResultsFile {
 public:
  // Reads `path` if it exists (kInvalidArgument names a line that is not a cell record) and appends to it;
  // an empty path keeps the results in memory only.
  static Result<ResultsFile> open(const std::string& path);

  // The result recorded for `cell`, or nullptr.
  const nlohmann::json* find(const nlohmann::json& cell) const;
  // Records `cell` -> `result` (replacing nothing: a cell already present is an internal error).
  Status append(const nlohmann::json& cell, const nlohmann::json& result);
  // Every record, in key order: {"cell": ..., "result": ...}.
  std::vector<nlohmann::json> records() const;
  size_t size() const { return results_.size(); }

 private:
  std::string path_;
  std::map<std::string, std::pair<nlohmann::json, nlohmann::json>> results_;  // cell.dump() -> (cell, result)
  std::unique_ptr<std::ofstream> out_;
};

}  // namespace se::cli
