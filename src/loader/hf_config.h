// The internal model config: an HF config.json object, validated and completed with defaults, plus
// the typed dimensions (ModelDims) the loader and the model read from it. Pure functions;
// thread-safe.
//
// Supported model_type values: llama, qwen2, qwen3, gemma3_text (a multimodal "gemma3" config is
// flattened to its text_config). Normalized configs always carry: model_type, architectures,
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, vocab_size, rms_norm_eps, rope_theta, rope_scaling (object or null),
// max_position_embeddings, tie_word_embeddings, attention_bias, hidden_act (or hidden_activation
// for gemma3_text); gemma3_text adds sliding_window, sliding_window_pattern, layer_types,
// rope_local_base_freq, query_pre_attn_scalar, final_logit_softcapping, attn_logit_softcapping.
// transformers-5 style `rope_parameters` is folded into rope_theta / rope_scaling /
// rope_local_base_freq.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace se {

enum class ModelArch { kLlama, kQwen2, kQwen3, kGemma3 };

struct ModelDims {
  ModelArch arch = ModelArch::kLlama;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry biases (always for qwen2)
  bool qk_norm = false;         // per-head RMSNorm on q and k (qwen3, gemma3)
  bool sandwich_norm = false;   // extra norms after attention and around the MLP (gemma3)
};

// Validates `config` (required keys present, sizes positive and within sane limits, head counts and
// head_dim consistent) and returns the normalized form described above. Errors name `source` and
// the offending key.
Result<nlohmann::json> normalize_hf_config(const nlohmann::json& config, const std::string& source);

// The typed dimensions of a normalized config.
ModelDims model_dims(const nlohmann::json& normalized);

}  // namespace se
