// load_model: the one entry point that turns a model path into the internal form (HF-style config +
// HF-named CPU weights), whatever the source: a .gguf file, an HF directory (config.json +
// safetensors), or a config alone with dummy weights. The formats are read by loader/; which tensors a model
// has and how each is laid out is its architecture's (model/arch/). A LoadedModel is a plain value; weights share
// storage when it is copied.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "base/status.h"
#include "loader/fp8_block_weights.h"
#include "loader/gguf_file.h"
#include "loader/kv_cache_scales.h"
#include "loader/progress_bar.h"
#include "model/config.h"
#include "model/weight_sink.h"
#include "tensor/tensor.h"

namespace se {

enum class LoadFormat {
  kAuto,  // .gguf file -> GGUF; directory with config.json -> HF
  kGguf,
  kHf,
  kDummy,  // path is a config.json or a directory holding one; weights are random (dummy_weights.h)
};

struct LoadOptions {
  LoadFormat format = LoadFormat::kAuto;
  DType dtype = DType::kF32;  // every weight is converted to this (F32, F16 or BF16)
  uint64_t seed = 0;          // dummy weights only
  bool show_progress = true;  // a progress bar on stderr, only when stderr is a terminal
};

struct LoadedModel {
  ModelConfig config;                     // typed, built by the model's architecture (model/arch/)
  nlohmann::json hf_config;               // the normalized HF-style config it was built from (hf_config.h)
  std::map<std::string, Tensor> weights;  // canonical names and shapes (weight_spec.h)
  std::string source_format;              // "gguf", "hf" or "dummy"
  std::optional<GgufFile> gguf;           // the GGUF file (vocabulary, chat template) when source_format == "gguf"
  std::string hf_dir;                     // the HF directory (tokenizer.json, tokenizer_config.json) for "hf"; for
                                          // "dummy" the directory of the config
  std::optional<KvCacheScales> kv_cache_scales;  // the FP8 KV cache scales an "hf" checkpoint ships
};

// Loads `path` per `options`. Errors name the path and what is wrong (kNotFound, kDataLoss,
// kInvalidArgument, kUnimplemented for unsupported architectures and quant types).
Result<LoadedModel> load_model(const std::string& path, const LoadOptions& options = {});
// The same load with the weights handed to `sink` one at a time as they are read (LoadedModel::weights stays
// empty), so the host holds about one weight at a time whatever the sink keeps: a GPU's ModelWeightsBuilder
// uploads each and frees it (weights_builder.h).
Result<LoadedModel> load_model(const std::string& path, const LoadOptions& options, WeightSink& sink);

// Every weight of `config` with dummy values (loader/dummy_weights.h), in `dtype`, handed to `sink` one at a
// time: linear and embedding weights roughly normal(0, 0.02), norms ones, biases zeros. With `fp8` (nullable;
// config.json's block-scaled FP8 quantization_config) the linear weights an FP8 checkpoint quantizes are written
// as e4m3 codes and block scales and dequantized as stream_hf_weights reads them. `progress` (nullable) advances
// once per weight.
Status stream_dummy_weights(const ModelConfig& config, DType dtype, uint64_t seed, const Fp8BlockQuantization* fp8,
                            WeightSink& sink, ProgressBar* progress);
// The same weights in a map.
std::map<std::string, Tensor> dummy_weights(const ModelConfig& config, DType dtype, uint64_t seed,
                                            ProgressBar* progress, const Fp8BlockQuantization* fp8 = nullptr);

// Parses "auto", "gguf", "hf"/"safetensors", "dummy" (the CLI's --load-format).
Result<LoadFormat> parse_load_format(const std::string& name);

}  // namespace se
