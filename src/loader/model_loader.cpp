#include "loader/model_loader.h"

#include <filesystem>

#include "base/mapped_file.h"
#include "loader/dummy_weights.h"
#include "loader/gguf_model.h"
#include "loader/hf_config.h"
#include "loader/hf_dir.h"
#include "loader/progress_bar.h"
#include "loader/safetensors_file.h"
#include "loader/weight_spec.h"

namespace se {

namespace {

namespace fs = std::filesystem;

int64_t num_weights(const nlohmann::json& config) {
  return static_cast<int64_t>(expected_weights(model_dims(config)).size());
}

std::string label(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return "Loading " + (name.empty() ? path : name);
}

Result<LoadedModel> load_gguf(const std::string& path, const LoadOptions& options) {
  LoadedModel model;
  model.source_format = "gguf";
  SE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  SE_ASSIGN_OR_RETURN(model.config, gguf_hf_config(file));
  ProgressBar progress(label(path), num_weights(model.config), options.show_progress);
  SE_ASSIGN_OR_RETURN(model.weights,
                      load_gguf_weights(file, model.config, options.dtype, &progress));
  model.gguf = std::move(file);
  return model;
}

Result<LoadedModel> load_hf(const std::string& dir, const LoadOptions& options) {
  LoadedModel model;
  model.source_format = "hf";
  SE_ASSIGN_OR_RETURN(HfDir hf, open_hf_dir(dir));
  SE_ASSIGN_OR_RETURN(SafetensorsCheckpoint checkpoint, SafetensorsCheckpoint::open_dir(dir));
  ProgressBar progress(label(dir), num_weights(hf.config), options.show_progress);
  SE_ASSIGN_OR_RETURN(model.weights, load_hf_weights(hf, checkpoint, options.dtype, &progress));
  model.config = hf.config;
  model.hf_dir = dir;
  return model;
}

Result<LoadedModel> load_dummy(const std::string& path, const LoadOptions& options) {
  const fs::path config_path =
      fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  LoadedModel model;
  model.source_format = "dummy";
  SE_ASSIGN_OR_RETURN(model.config, read_hf_config(config_path.string()));
  ProgressBar progress("Generating dummy weights", num_weights(model.config),
                       options.show_progress);
  model.weights = dummy_weights(model.config, options.dtype, options.seed, &progress);
  model.hf_dir = config_path.parent_path().string();
  return model;
}

}  // namespace

Result<LoadFormat> parse_load_format(const std::string& name) {
  if (name == "auto") return LoadFormat::kAuto;
  if (name == "gguf") return LoadFormat::kGguf;
  if (name == "hf" || name == "safetensors") return LoadFormat::kHf;
  if (name == "dummy") return LoadFormat::kDummy;
  return invalid_argument("unknown load format \"{}\" (auto, gguf, hf, safetensors, dummy)", name);
}

Result<LoadedModel> load_model(const std::string& path, const LoadOptions& options) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kF16 &&
      options.dtype != DType::kBF16) {
    return invalid_argument("{}: weights can load as f32, f16 or bf16, not {}", path,
                            dtype_name(options.dtype));
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found("{}: no such file or directory", path);
  switch (options.format) {
    case LoadFormat::kGguf:
      return load_gguf(path, options);
    case LoadFormat::kHf:
      return load_hf(path, options);
    case LoadFormat::kDummy:
      return load_dummy(path, options);
    case LoadFormat::kAuto:
      break;
  }
  if (fs::is_directory(path)) {
    if (!fs::exists(fs::path(path) / "config.json"))
      return not_found("{}: directory has no config.json", path);
    return load_hf(path, options);
  }
  if (fs::path(path).extension() == ".gguf") return load_gguf(path, options);
  // Anything else: sniff the GGUF magic.
  SE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  if (file.size() >= 4 &&
      std::string_view(reinterpret_cast<const char*>(file.data()), 4) == "GGUF") {
    return load_gguf(path, options);
  }
  return invalid_argument(
      "{}: not a .gguf file or an HF model directory (use --load-format dummy for a "
      "config.json alone)",
      path);
}

}  // namespace se
