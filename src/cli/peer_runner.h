// PeerRunner: runs the Python side of side-by-side benchmarks (tools/*.py in the repo's .venv), e.g. llama.cpp
// through llama-cpp-python, and prepares the files they need. The repo is found from the binary's location
// (build/sparse-engine) or SE_SOURCE_DIR.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace se::cli {

class PeerRunner {
 public:
  PeerRunner();

  // Runs tools/<script> with `args`; its last stdout line must be a JSON object, which is returned.
  Result<nlohmann::json> run_json(const std::string& script, const std::vector<std::string>& args) const;
  // An F32 copy of a GGUF (tools/gguf_to_f32.py), cached next to the binary under test-models/.
  Result<std::string> f32_copy(const std::string& gguf_path) const;

 private:
  std::string source_dir_;
  std::string cache_dir_;
};

}  // namespace se::cli
