#include "cli/peer_runner.h"

#include <cstdlib>
#include <filesystem>

#include "base/subprocess.h"

namespace se::cli {

namespace fs = std::filesystem;

PeerRunner::PeerRunner() {
  std::error_code ec;
  const fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  const char* env = std::getenv("SE_SOURCE_DIR");
  source_dir_ = env != nullptr ? std::string(env) : exe_dir.parent_path().string();
  cache_dir_ = (exe_dir / "test-models").string();
}

Result<nlohmann::json> PeerRunner::run_json(const std::string& script, const std::vector<std::string>& args) const {
  const fs::path python = fs::path(source_dir_) / ".venv" / "bin" / "python";
  const fs::path tool = fs::path(source_dir_) / "tools" / script;
  if (!fs::exists(python)) return not_found("{}: missing; run scripts/install-deps.sh", python.string());
  std::vector<std::string> argv = {python.string(), tool.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  SE_ASSIGN_OR_RETURN(std::string out, run_process(argv));
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  const std::string last_line = out.substr(out.find_last_of('\n') == std::string::npos ? 0 : out.find_last_of('\n') + 1);
  auto parsed = nlohmann::json::parse(last_line, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return internal_error("{}: expected a JSON object on its last line, got '{}'", script, last_line);
  return parsed;
}

Result<std::string> PeerRunner::f32_copy(const std::string& gguf_path) const {
  const fs::path target = fs::path(cache_dir_) / (fs::path(gguf_path).stem().string() + ".F32.gguf");
  if (fs::exists(target)) return target.string();
  std::error_code ec;
  fs::create_directories(cache_dir_, ec);
  const fs::path python = fs::path(source_dir_) / ".venv" / "bin" / "python";
  const std::string partial = target.string() + ".partial";
  SE_RETURN_IF_ERROR(
      run_process({python.string(), (fs::path(source_dir_) / "tools" / "gguf_to_f32.py").string(), gguf_path, partial})
          .status());
  fs::rename(partial, target, ec);
  if (ec) return internal_error("cannot rename {}: {}", partial, ec.message());
  return target.string();
}

}  // namespace se::cli
