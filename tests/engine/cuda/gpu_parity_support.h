// What the GPU parity tests share: the models they run on both devices (the tiny random model with the same bf16
// weights on each, real checkpoints when their files are present), prompts, logits comparisons, and greedy runs
// of a method through the engine.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model_bundle.h"
#include "model/model.h"

namespace se::gpu_parity {

int32_t argmax(const std::vector<float>& row);
// sqrt(sum (got - want)^2 / sum want^2); infinite where `got` is not finite.
double relative_error(const std::vector<float>& got, const std::vector<float>& want);
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b);

// F32 dummy weights of `normalized` (scaled by `scale` away from ties, then rounded to BF16 values).
std::map<std::string, Tensor> bf16_dummy_weights(const nlohmann::json& normalized, float scale);
Model create_model(const nlohmann::json& normalized, const std::map<std::string, Tensor>& weights, Device device);
// The tiny test model with heads of 64 (the smallest head_dim the CUDA attention kernels take).
nlohmann::json tiny_config(const std::string& model_type);
std::vector<std::vector<int32_t>> random_prompts(int count, int vocab, int min_len, int max_len, uint32_t seed);

// One model on both devices.
struct DeviceBundles {
  ModelBundle cpu, gpu;
};
// The tiny Llama on both devices, with the same bf16 weights.
DeviceBundles tiny_cpu_and_gpu_bundles();

// Short English and code prompts for real checkpoints.
const std::vector<std::string>& prompt_texts();

// A real checkpoint in BF16 on both devices (CPU: as F32), with prompt_texts() from its tokenizer.
struct RealModel {
  DeviceBundles bundles;
  std::vector<std::vector<int32_t>> prompts;
};
// The checkpoint at $`env`, else at `fallback`; nullopt when there is none.
std::optional<RealModel> load_real(const char* env, std::optional<std::string> fallback);

// Greedy continuations of `prompts` through an engine on `device` running `method` with `config` (`max_num_seqs`
// sequence slots, 24-token steps: chunked prefill mixed with decode) over the KV store `kv_cache_dtype` (a KIVI
// store's window `kivi_residual` tokens), with each step's margin: the logprob of the chosen token over the
// runner-up's.
struct EngineTrace {
  std::vector<int32_t> tokens;
  std::vector<float> margins;
};
std::vector<EngineTrace> engine_traces(const ModelBundle& bundle, Device device, const std::string& method,
                                       const nlohmann::json& method_config,
                                       const std::vector<std::vector<int32_t>>& prompts, int num_new,
                                       bool enforce_eager = false, int max_num_seqs = 4,
                                       const std::string& kv_cache_dtype = "auto", int kivi_residual = 128);

}  // namespace se::gpu_parity
