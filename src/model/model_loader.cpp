#include "model/model_loader.h"

#include <filesystem>

#include "base/check.h"
#include "base/mapped_file.h"
#include "loader/dummy_weights.h"
#include "loader/fp8_block_weights.h"
#include "loader/progress_bar.h"
#include "loader/safetensors_file.h"
#include "loader/weight_transforms.h"
#include "model/gguf_model.h"
#include "model/hf_config.h"
#include "model/hf_dir.h"
#include "model/weight_spec.h"

namespace se {

namespace {

namespace fs = std::filesystem;

// The typed config of a normalized one; errors name `path`.
Result<ModelConfig> typed_config(const nlohmann::json& config, const std::string& path) {
  Result<ModelConfig> typed = parse_model_config(config);
  if (!typed.is_ok()) return typed.status().with_context(path);
  return typed;
}

int64_t num_weights(const ModelConfig& config) { return static_cast<int64_t>(expected_weights(config).size()); }

DummyFill dummy_fill(WeightKind kind) {
  switch (kind) {
    case WeightKind::kNorm:
      return DummyFill::kOnes;
    case WeightKind::kBias:
      return DummyFill::kZeros;
    case WeightKind::kLinear:
    case WeightKind::kEmbedding:
      break;
  }
  return DummyFill::kNormal;
}

std::string label(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return "Loading " + (name.empty() ? path : name);
}

// Each format's load: the model's config and metadata, with its weights handed to `sink`.
Result<LoadedModel> load_gguf(const std::string& path, const LoadOptions& options, WeightSink& sink) {
  LoadedModel model;
  model.source_format = "gguf";
  SE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  SE_ASSIGN_OR_RETURN(model.hf_config, gguf_hf_config(file));
  SE_ASSIGN_OR_RETURN(model.config, typed_config(model.hf_config, path));
  SE_RETURN_IF_ERROR(sink.begin(model.config));
  ProgressBar progress(label(path), num_weights(model.config), options.show_progress);
  SE_RETURN_IF_ERROR(stream_gguf_weights(file, model.config, options.dtype, sink, &progress));
  model.gguf = std::move(file);
  return model;
}

Result<LoadedModel> load_hf(const std::string& dir, const LoadOptions& options, WeightSink& sink) {
  LoadedModel model;
  model.source_format = "hf";
  SE_ASSIGN_OR_RETURN(HfDir hf, open_hf_dir(dir));
  SE_ASSIGN_OR_RETURN(SafetensorsCheckpoint checkpoint, SafetensorsCheckpoint::open_dir(dir));
  SE_ASSIGN_OR_RETURN(model.config, typed_config(hf.config, dir));
  SE_RETURN_IF_ERROR(sink.begin(model.config));
  ProgressBar progress(label(dir), num_weights(model.config), options.show_progress);
  SE_RETURN_IF_ERROR(stream_hf_weights(hf, model.config, checkpoint, options.dtype, sink, &progress));
  SE_ASSIGN_OR_RETURN(model.kv_cache_scales,
                      read_kv_cache_scales(checkpoint, model.config.num_layers, model.config.num_kv_heads, dir));
  model.hf_config = hf.config;
  model.hf_dir = dir;
  return model;
}

Result<LoadedModel> load_dummy(const std::string& path, const LoadOptions& options, WeightSink& sink) {
  const fs::path config_path = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  LoadedModel model;
  model.source_format = "dummy";
  SE_ASSIGN_OR_RETURN(model.hf_config, read_hf_config(config_path.string()));
  SE_ASSIGN_OR_RETURN(model.config, typed_config(model.hf_config, config_path.string()));
  SE_ASSIGN_OR_RETURN(const std::optional<Fp8BlockQuantization> fp8,
                      fp8_block_quantization(model.hf_config, config_path.string()));
  SE_RETURN_IF_ERROR(sink.begin(model.config));
  ProgressBar progress("Generating dummy weights", num_weights(model.config), options.show_progress);
  SE_RETURN_IF_ERROR(
      stream_dummy_weights(model.config, options.dtype, options.seed, fp8 ? &*fp8 : nullptr, sink, &progress));
  model.hf_dir = config_path.parent_path().string();
  return model;
}

}  // namespace

Status stream_dummy_weights(const ModelConfig& config, DType dtype, uint64_t seed, const Fp8BlockQuantization* fp8,
                            WeightSink& sink, ProgressBar* progress) {
  for (const WeightSpec& spec : expected_weights(config)) {
    Tensor t = dummy_tensor(spec.name, spec.shape, dummy_fill(spec.kind), seed);
    if (fp8 != nullptr && spec.kind == WeightKind::kLinear && fp8_quantizes(*fp8, spec.name)) {
      // What an FP8 checkpoint stores, read back as the HF loader reads it.
      Fp8BlockWeight q = quantize_fp8_blocks(t, *fp8);
      t = Tensor();  // the codes hold the weight now: one fp32 copy at a time
      if (sink.keeps_fp8(spec, *fp8)) {
        SE_RETURN_IF_ERROR(sink.put_fp8(spec, std::move(q)));
        if (progress != nullptr) progress->advance();
        continue;
      }
      Result<Tensor> w =
          dequantize_fp8_blocks(q.codes.data<uint8_t>(), q.codes.shape(), q.scale_inv, *fp8, fp8_scale_name(spec.name));
      SE_CHECK(w.is_ok(), "{}", w.status().to_string());  // the scales are shaped for the codes above
      t = std::move(w).value();
    }
    Tensor cast = cast_weight(t, dtype);
    t = Tensor();  // the sink may free the weight at once
    SE_RETURN_IF_ERROR(sink.put(spec, std::move(cast)));
    if (progress != nullptr) progress->advance();
  }
  return Status::ok();
}

std::map<std::string, Tensor> dummy_weights(const ModelConfig& config, DType dtype, uint64_t seed,
                                            ProgressBar* progress, const Fp8BlockQuantization* fp8) {
  WeightMapSink sink;
  const Status status = stream_dummy_weights(config, dtype, seed, fp8, sink, progress);
  SE_CHECK(status.is_ok(), "{}", status.to_string());  // a map takes every weight
  return std::move(sink.weights());
}

Result<LoadFormat> parse_load_format(const std::string& name) {
  if (name == "auto") return LoadFormat::kAuto;
  if (name == "gguf") return LoadFormat::kGguf;
  if (name == "hf" || name == "safetensors") return LoadFormat::kHf;
  if (name == "dummy") return LoadFormat::kDummy;
  return invalid_argument("unknown load format \"{}\" (auto, gguf, hf, safetensors, dummy)", name);
}

Result<LoadedModel> load_model(const std::string& path, const LoadOptions& options, WeightSink& sink) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kF16 && options.dtype != DType::kBF16) {
    return invalid_argument("{}: weights can load as f32, f16 or bf16, not {}", path, dtype_name(options.dtype));
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found("{}: no such file or directory", path);
  switch (options.format) {
    case LoadFormat::kGguf:
      return load_gguf(path, options, sink);
    case LoadFormat::kHf:
      return load_hf(path, options, sink);
    case LoadFormat::kDummy:
      return load_dummy(path, options, sink);
    case LoadFormat::kAuto:
      break;
  }
  if (fs::is_directory(path)) {
    if (!fs::exists(fs::path(path) / "config.json")) return not_found("{}: directory has no config.json", path);
    return load_hf(path, options, sink);
  }
  if (fs::path(path).extension() == ".gguf") return load_gguf(path, options, sink);
  // Anything else: sniff the GGUF magic.
  SE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  if (file.size() >= 4 && std::string_view(reinterpret_cast<const char*>(file.data()), 4) == "GGUF") {
    return load_gguf(path, options, sink);
  }
  return invalid_argument(
      "{}: not a .gguf file or an HF model directory (use --load-format dummy for a "
      "config.json alone)",
      path);
}

Result<LoadedModel> load_model(const std::string& path, const LoadOptions& options) {
  WeightMapSink sink;
  SE_ASSIGN_OR_RETURN(LoadedModel model, load_model(path, options, sink));
  model.weights = std::move(sink.weights());
  return model;
}

}  // namespace se
