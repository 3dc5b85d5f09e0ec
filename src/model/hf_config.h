// The normalized HF config: an HF config.json object, validated and completed with defaults, so that every
// reader (parse_model_config, the weight list, `inspect`) sees the same keys. The common keys are normalized here;
// each architecture's registry entry (model/arch/) adds its defaults and its own keys. Pure functions; thread-safe.
//
// Normalized configs always carry: model_type, architectures, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, vocab_size, rms_norm_eps, rope_theta, rope_scaling (object
// or null), max_position_embeddings, tie_word_embeddings, attention_bias, and the architecture's activation key.
// transformers-5 style `rope_parameters` is folded into rope_theta / rope_scaling / rope_local_base_freq.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace se {

// Upper bounds that no real model reaches; they stop a corrupted config from asking for absurd allocations.
inline constexpr int64_t kMaxConfigWidth = int64_t{1} << 20;  // hidden, intermediate, head_dim
inline constexpr int64_t kMaxConfigLayers = 4096;
inline constexpr int64_t kMaxConfigPositions = int64_t{1} << 30;

// Validates `config` (required keys present, sizes positive and within sane limits, head counts and head_dim
// consistent) and returns the normalized form described above. Errors name `source` and the offending key.
Result<nlohmann::json> normalize_hf_config(const nlohmann::json& config, const std::string& source);

// Typed reads for the architectures' own keys; errors name `source` and the key.
// An integer in [1, max]; absent keys take `fallback` when given, else are an error.
Result<int64_t> read_size(const nlohmann::json& c, const char* key, int64_t max, const std::string& source,
                          std::optional<int64_t> fallback = std::nullopt);
// A positive finite number; absent keys take `fallback`.
Result<double> read_positive(const nlohmann::json& c, const char* key, double fallback, const std::string& source);
Result<bool> read_bool(const nlohmann::json& c, const char* key, bool fallback, const std::string& source);
// `hidden_act` defaults to silu, the only activation the SwiGLU architectures take.
Status require_silu(nlohmann::json& hf, const std::string& source);

}  // namespace se
