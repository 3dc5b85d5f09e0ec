#include "model/hf_dir.h"

#include <cstring>
#include <filesystem>
#include <optional>

#include "base/mapped_file.h"
#include "loader/fp8_block_weights.h"
#include "loader/weight_transforms.h"
#include "model/arch/arch_registry.h"
#include "model/hf_config.h"
#include "model/weight_spec.h"

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

Status stream_hf_weights(const HfDir& hf, const ModelConfig& config, const SafetensorsCheckpoint& checkpoint,
                         DType dtype, WeightSink& sink, ProgressBar* progress) {
  const ArchSpec& arch = arch_of(config);
  SE_ASSIGN_OR_RETURN(const std::optional<Fp8BlockQuantization> fp8,
                      fp8_block_quantization(hf.config, (fs::path(hf.dir) / "config.json").string()));
  // The FP8 scales of weight `name` of `shape`, checked against it.
  const auto read_scales = [&](const std::string& name, const Shape& shape) -> Result<Tensor> {
    const std::string scale_name = fp8_scale_name(name);
    if (!checkpoint.contains(scale_name))
      return data_loss("{}: FP8 tensor '{}' has no scale tensor '{}'", hf.dir, name, scale_name);
    SE_ASSIGN_OR_RETURN(Tensor scale, checkpoint.load(scale_name));
    const Status fits = check_fp8_scales(shape, scale, *fp8, scale_name);
    if (!fits.is_ok()) return fits.with_context(hf.dir);
    return scale;
  };
  // An e4m3 weight `name` (its shape checked), dequantized to fp32 with the scales stored beside it.
  const auto read_fp8 = [&](const SafetensorsFile& file, const std::string& name,
                            const Shape& shape) -> Result<Tensor> {
    if (!fp8) {
      return unimplemented("{}: tensor '{}' is F8_E4M3 but config.json has no fp8 quantization_config", file.path(),
                           name);
    }
    SE_ASSIGN_OR_RETURN(Tensor scale, read_scales(name, shape));
    Result<Tensor> w = dequantize_fp8_blocks(file.find(name)->data, shape, scale, *fp8, fp8_scale_name(name));
    if (!w.is_ok()) return w.status().with_context(hf.dir);
    return w;
  };
  // The stored name of canonical weight `name`, its shape checked against `shape`.
  const auto locate = [&](const std::string& name, const Shape& shape) -> Result<std::string> {
    for (const std::string& candidate : candidate_names(name)) {
      if (!checkpoint.contains(candidate)) continue;
      const SafetensorsFile* file = checkpoint.file_of(candidate);
      const SafetensorsTensorInfo* info = file->find(candidate);
      const Shape stored(info->shape.begin(), info->shape.end());
      if (!(stored == shape)) {
        return data_loss("{}: tensor '{}' has shape {} but config.json implies {}", file->path(), candidate,
                         stored.to_string(), shape.to_string());
      }
      return candidate;
    }
    return data_loss("{}: checkpoint has no tensor '{}'", hf.dir, name);
  };
  // One stored tensor, checked against `shape`.
  const auto read = [&](const std::string& name, const Shape& shape) -> Result<Tensor> {
    SE_ASSIGN_OR_RETURN(const std::string found, locate(name, shape));
    const SafetensorsFile* file = checkpoint.file_of(found);
    const SafetensorsTensorInfo* info = file->find(found);
    if (info->dtype == "F8_E4M3") return read_fp8(*file, found, shape);
    if (info->dtype != "F32" && info->dtype != "F16" && info->dtype != "BF16") {
      return unimplemented("{}: tensor '{}' has dtype {} (F32, F16, BF16 and block-scaled F8_E4M3 are supported)",
                           file->path(), found, info->dtype);
    }
    return file->load(found);
  };
  // Per-expert FP8 tensors as stored, stacked along a new first dimension (codes and scales), for a sink that keeps
  // FP8; nullopt when the experts are not stored in FP8.
  const auto read_fp8_experts = [&](const WeightSpec& spec,
                                    const Shape& part_shape) -> Result<std::optional<Fp8BlockWeight>> {
    SE_ASSIGN_OR_RETURN(const std::string first, locate(spec.hf_parts.front(), part_shape));
    if (checkpoint.file_of(first)->find(first)->dtype != "F8_E4M3") return std::optional<Fp8BlockWeight>();
    const Shape part_scale = fp8_block_scale_shape(part_shape, *fp8);
    Fp8BlockWeight stacked{Tensor::empty(DType::kU8, spec.shape),
                           Tensor::empty(DType::kF32, fp8_block_scale_shape(spec.shape, *fp8))};
    auto* codes = static_cast<char*>(stacked.codes.raw());
    auto* scales = stacked.scale_inv.data<float>();
    for (const std::string& part : spec.hf_parts) {
      SE_ASSIGN_OR_RETURN(const std::string found, locate(part, part_shape));
      const SafetensorsTensorInfo* info = checkpoint.file_of(found)->find(found);
      if (info->dtype != "F8_E4M3")
        return data_loss("{}: expert tensor '{}' is {} but the other experts are F8_E4M3", hf.dir, found, info->dtype);
      std::memcpy(codes, info->data, static_cast<size_t>(part_shape.numel()));
      codes += part_shape.numel();
      SE_ASSIGN_OR_RETURN(Tensor scale, read_scales(found, part_shape));
      const Tensor f = cast_weight(scale, DType::kF32);
      std::memcpy(scales, f.raw(), f.nbytes());
      scales += part_scale.numel();
    }
    return std::optional<Fp8BlockWeight>(std::move(stacked));
  };
  for (const WeightSpec& spec : expected_weights(config)) {
    Tensor t;
    if (spec.hf_parts.empty()) {
      SE_ASSIGN_OR_RETURN(t, read(spec.name, spec.shape));
    } else {
      std::vector<int64_t> part_dims;
      for (int i = 1; i < spec.shape.rank(); ++i) part_dims.push_back(spec.shape[i]);
      const Shape part_shape(part_dims.begin(), part_dims.end());
      if (fp8 && arch.from_hf_tensor == nullptr && sink.keeps_fp8(spec, *fp8)) {
        SE_ASSIGN_OR_RETURN(std::optional<Fp8BlockWeight> stored, read_fp8_experts(spec, part_shape));
        if (stored) {
          SE_RETURN_IF_ERROR(sink.put_fp8(spec, std::move(*stored)));
          if (progress != nullptr) progress->advance();
          continue;
        }
      }
      // Per-expert tensors, stacked in fp32 along a new first dimension.
      t = Tensor::empty(DType::kF32, spec.shape);
      auto* dst = static_cast<char*>(t.raw());
      for (const std::string& part : spec.hf_parts) {
        SE_ASSIGN_OR_RETURN(Tensor p, read(part, part_shape));
        const Tensor f = cast_weight(p, DType::kF32);
        std::memcpy(dst, f.raw(), f.nbytes());
        dst += f.nbytes();
      }
    }
    if (arch.from_hf_tensor != nullptr) t = arch.from_hf_tensor(spec, std::move(t));
    Tensor w = cast_weight(t, dtype);
    t = Tensor();  // the sink may free w at once: nothing else here keeps the weight alive
    SE_RETURN_IF_ERROR(sink.put(spec, std::move(w)));
    if (progress != nullptr) progress->advance();
  }
  return Status::ok();
}

}  // namespace se
