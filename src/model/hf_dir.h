// HfDir: a Hugging Face model directory: the validated config.json, the paths of the tokenizer
// files, and the canonical weights read from its safetensors. Plain values; stream_hf_weights is
// thread-safe for distinct outputs.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "loader/progress_bar.h"
#include "loader/safetensors_file.h"
#include "model/config.h"
#include "model/weight_sink.h"
#include "tensor/tensor.h"

namespace se {

struct HfDir {
  std::string dir;
  nlohmann::json config;               // normalized (hf_config.h)
  std::string tokenizer_json;          // path, or "" when the directory has none
  std::string tokenizer_config_json;   // path, or ""
  std::string generation_config_json;  // path, or ""
};

// Reads and validates `dir`/config.json and locates the tokenizer files. Errors name the file.
Result<HfDir> open_hf_dir(const std::string& dir);

// Reads and normalizes a config.json file.
Result<nlohmann::json> read_hf_config(const std::string& path);

// Every weight of expected_weights(config) (`config` parsed from hf.config) from `checkpoint`, in `dtype`, in
// the canonical layout (the architecture's from_hf_tensor; per-expert tensors stacked), handed to `sink` one at a
// time. F8_E4M3 weights of a checkpoint with a block-scaled fp8 quantization_config are dequantized with their
// weight_scale_inv (loader/fp8_block_weights.h); a missing or mis-shaped scale is an error naming it. Multimodal
// names (language_model.model.*, model.language_model.*) are accepted; tensors the model does not use (vision
// tower, rotary caches) are ignored. Errors name the tensor.
Status stream_hf_weights(const HfDir& hf, const ModelConfig& config, const SafetensorsCheckpoint& checkpoint,
                         DType dtype, WeightSink& sink, ProgressBar* progress);

}  // namespace se
