#include "loader/hf_dir.h"

#include <filesystem>

#include "base/mapped_file.h"
#include "loader/hf_config.h"
#include "loader/weight_spec.h"
#include "loader/weight_transforms.h"

namespace se {

namespace {

namespace fs = std::filesystem;

std::string existing(const fs::path& p) { return fs::is_regular_file(p) ? p.string() : ""; }

// The names a canonical weight may carry in a checkpoint, most common first.
std::vector<std::string> candidate_names(const std::string& name) {
  std::vector<std::string> out = {name};
  if (name.rfind("model.", 0) == 0) {
    const std::string rest = name.substr(6);
    out.push_back("language_model.model." + rest);
    out.push_back("model.language_model." + rest);
  } else if (name == "lm_head.weight") {
    out.push_back("language_model.lm_head.weight");
  }
  return out;
}

}  // namespace

Result<nlohmann::json> read_hf_config(const std::string& path) {
  SE_ASSIGN_OR_RETURN(std::string text, read_file(path));
  nlohmann::json raw = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (raw.is_discarded()) return invalid_argument("{}: not valid JSON", path);
  return normalize_hf_config(raw, path);
}

Result<HfDir> open_hf_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) return not_found("{}: not a directory", dir);
  HfDir hf;
  hf.dir = dir;
  const fs::path root(dir);
  if (!fs::is_regular_file(root / "config.json")) return not_found("{}: no config.json", dir);
  SE_ASSIGN_OR_RETURN(hf.config, read_hf_config((root / "config.json").string()));
  hf.tokenizer_json = existing(root / "tokenizer.json");
  hf.tokenizer_config_json = existing(root / "tokenizer_config.json");
  hf.generation_config_json = existing(root / "generation_config.json");
  return hf;
}

Result<std::map<std::string, Tensor>> load_hf_weights(const HfDir& hf,
                                                      const SafetensorsCheckpoint& checkpoint,
                                                      DType dtype, ProgressBar* progress) {
  const ModelDims dims = model_dims(hf.config);
  std::map<std::string, Tensor> weights;
  for (const WeightSpec& spec : expected_weights(dims)) {
    std::string found;
    for (const std::string& candidate : candidate_names(spec.name)) {
      if (checkpoint.contains(candidate)) {
        found = candidate;
        break;
      }
    }
    if (found.empty()) return data_loss("{}: checkpoint has no tensor '{}'", hf.dir, spec.name);
    const SafetensorsFile* file = checkpoint.file_of(found);
    const SafetensorsTensorInfo* info = file->find(found);
    const Shape shape(info->shape.begin(), info->shape.end());
    if (!(shape == spec.shape)) {
      return data_loss("{}: tensor '{}' has shape {} but config.json implies {}", file->path(),
                       found, shape.to_string(), spec.shape.to_string());
    }
    if (info->dtype != "F32" && info->dtype != "F16" && info->dtype != "BF16") {
      return unimplemented("{}: tensor '{}' has dtype {} (F32, F16 and BF16 are supported)",
                           file->path(), found, info->dtype);
    }
    SE_ASSIGN_OR_RETURN(Tensor t, file->load(found));
    if (dims.arch == ModelArch::kGemma3 && spec.kind == WeightKind::kNorm) {
      // HF Gemma computes x * (1 + w); the internal convention stores the multiplier (added in
      // fp32).
      t = add_one(cast_weight(t, DType::kF32));
    }
    weights[spec.name] = cast_weight(t, dtype);
    if (progress != nullptr) progress->advance();
  }
  return weights;
}

}  // namespace se
