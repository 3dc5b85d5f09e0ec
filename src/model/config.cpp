#include "model/config.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "model/arch/arch_registry.h"
#include "model/config_json.h"

namespace se {

namespace {

// YaRN's fields, transformers' defaults where one is missing: the trained context defaults to
// max_position_embeddings, beta_fast / beta_slow to 32 / 1, and the attention factor to 0.1 ln(factor) + 1 (the
// ratio of two such terms when mscale and mscale_all_dim are given, as DeepSeek's configs do).
Status parse_yarn(const nlohmann::json& scaling, int max_position_embeddings, RopeParams& rope) {
  namespace cj = config_json;
  SE_ASSIGN_OR_RETURN(rope.original_max_position,
                      cj::int_or(scaling, "original_max_position_embeddings", max_position_embeddings));
  if (rope.original_max_position <= 0)
    return invalid_argument("config: yarn original_max_position_embeddings must be positive");
  // transformers reads these as `get(key) or default`: 0 falls back too.
  SE_ASSIGN_OR_RETURN(rope.beta_fast, cj::float_or(scaling, "beta_fast", 0.0f));
  SE_ASSIGN_OR_RETURN(rope.beta_slow, cj::float_or(scaling, "beta_slow", 0.0f));
  if (rope.beta_fast == 0.0f) rope.beta_fast = 32.0f;
  if (rope.beta_slow == 0.0f) rope.beta_slow = 1.0f;
  if (!(rope.beta_fast > rope.beta_slow && rope.beta_slow > 0.0f))
    return invalid_argument("config: yarn needs beta_fast > beta_slow > 0, got {} and {}", rope.beta_fast,
                            rope.beta_slow);
  SE_ASSIGN_OR_RETURN(rope.truncate, cj::bool_or(scaling, "truncate", true));
  const auto mscale_of = [&](float m) {
    return rope.factor <= 1.0f ? 1.0f : 0.1f * m * std::log(rope.factor) + 1.0f;
  };
  SE_ASSIGN_OR_RETURN(float mscale, cj::float_or(scaling, "mscale", 0.0f));
  SE_ASSIGN_OR_RETURN(float mscale_all_dim, cj::float_or(scaling, "mscale_all_dim", 0.0f));
  const float inferred = mscale != 0.0f && mscale_all_dim != 0.0f ? mscale_of(mscale) / mscale_of(mscale_all_dim)
                                                                   : mscale_of(1.0f);
  SE_ASSIGN_OR_RETURN(rope.attention_factor, cj::float_or(scaling, "attention_factor", inferred));
  if (!(rope.attention_factor > 0.0f)) return invalid_argument("config: yarn attention_factor must be positive");
  return Status::ok();
}

// RoPE from `rope_theta` + `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5).
Result<RopeParams> parse_rope(const nlohmann::json& hf, int head_dim, int max_position_embeddings) {
  RopeParams rope;
  rope.rotary_dim = head_dim;
  const nlohmann::json* scaling = nullptr;
  if (hf.contains("rope_parameters") && hf["rope_parameters"].is_object()) {
    scaling = &hf["rope_parameters"];
    SE_ASSIGN_OR_RETURN(rope.theta, config_json::float_or(*scaling, "rope_theta", 10000.0f));
  } else {
    SE_ASSIGN_OR_RETURN(rope.theta, config_json::float_or(hf, "rope_theta", 10000.0f));
    if (hf.contains("rope_scaling") && hf["rope_scaling"].is_object()) scaling = &hf["rope_scaling"];
  }
  if (rope.theta <= 0.0f) return invalid_argument("config: rope_theta must be positive");
  if (scaling == nullptr) return rope;
  std::string type;
  SE_ASSIGN_OR_RETURN(type, config_json::string_or(*scaling, "rope_type", ""));
  if (type.empty()) {
    SE_ASSIGN_OR_RETURN(type, config_json::string_or(*scaling, "type", "default"));
  }
  SE_ASSIGN_OR_RETURN(rope.factor, config_json::float_or(*scaling, "factor", 1.0f));
  if (type == "default") return rope;
  if (rope.factor <= 0.0f) return invalid_argument("config: rope scaling factor must be positive");
  if (type == "linear") {
    rope.scaling = RopeScaling::kLinear;
  } else if (type == "llama3") {
    rope.scaling = RopeScaling::kLlama3;
    SE_ASSIGN_OR_RETURN(rope.low_freq_factor, config_json::float_or(*scaling, "low_freq_factor", 1.0f));
    SE_ASSIGN_OR_RETURN(rope.high_freq_factor, config_json::float_or(*scaling, "high_freq_factor", 4.0f));
    SE_ASSIGN_OR_RETURN(rope.original_max_position,
                        config_json::int_or(*scaling, "original_max_position_embeddings", 8192));
    if (rope.high_freq_factor <= rope.low_freq_factor)
      return invalid_argument("config: llama3 rope needs high_freq_factor > low_freq_factor");
  } else if (type == "yarn") {
    rope.scaling = RopeScaling::kYarn;
    SE_RETURN_IF_ERROR(parse_yarn(*scaling, max_position_embeddings, rope));
  } else {
    return unimplemented("config: rope scaling type '{}' is not supported", type);
  }
  return rope;
}

Result<std::vector<int>> parse_eos(const nlohmann::json& hf) {
  std::vector<int> ids;
  if (!hf.contains("eos_token_id") || hf["eos_token_id"].is_null()) return ids;
  const auto& v = hf["eos_token_id"];
  if (v.is_number_integer()) {
    ids.push_back(v.get<int>());
  } else if (v.is_array()) {
    for (const auto& e : v) {
      if (!e.is_number_integer()) return invalid_argument("config: eos_token_id entries must be integers");
      ids.push_back(e.get<int>());
    }
  } else {
    return invalid_argument("config: eos_token_id must be an integer or a list");
  }
  return ids;
}

}  // namespace

Result<ModelConfig> parse_model_config(const nlohmann::json& hf) {
  namespace cj = config_json;
  if (!hf.is_object()) return invalid_argument("config: expected a JSON object");
  ModelConfig c;
  SE_ASSIGN_OR_RETURN(c.model_type, cj::string_or(hf, "model_type", ""));
  const ArchSpec* spec = find_arch(c.model_type);
  if (spec == nullptr)
    return unimplemented("config: model_type '{}' is not supported ({})", c.model_type, supported_model_types());
  c.arch = spec->name;
  SE_ASSIGN_OR_RETURN(c.vocab_size, cj::positive_int(hf, "vocab_size"));
  SE_ASSIGN_OR_RETURN(c.hidden_size, cj::positive_int(hf, "hidden_size"));
  SE_ASSIGN_OR_RETURN(c.intermediate_size, cj::positive_int(hf, "intermediate_size"));
  SE_ASSIGN_OR_RETURN(c.num_layers, cj::positive_int(hf, "num_hidden_layers"));
  SE_ASSIGN_OR_RETURN(c.num_heads, cj::positive_int(hf, "num_attention_heads"));
  SE_ASSIGN_OR_RETURN(c.num_kv_heads, cj::int_or(hf, "num_key_value_heads", c.num_heads));
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0)
    return invalid_argument("config: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                            c.num_heads, c.num_kv_heads);
  SE_ASSIGN_OR_RETURN(c.head_dim, cj::int_or(hf, "head_dim", c.hidden_size / c.num_heads));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    return invalid_argument("config: head_dim must be positive and even, got {}", c.head_dim);
  SE_ASSIGN_OR_RETURN(c.max_position_embeddings, cj::int_or(hf, "max_position_embeddings", 8192));
  SE_ASSIGN_OR_RETURN(c.rms_norm_eps, cj::float_or(hf, "rms_norm_eps", 1e-6f));
  SE_ASSIGN_OR_RETURN(c.tie_word_embeddings, cj::bool_or(hf, "tie_word_embeddings", false));
  SE_ASSIGN_OR_RETURN(c.attention_bias, cj::bool_or(hf, "attention_bias", false));
  SE_ASSIGN_OR_RETURN(c.bos_token_id, cj::int_or(hf, "bos_token_id", -1));
  SE_ASSIGN_OR_RETURN(c.eos_token_ids, parse_eos(hf));
  c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  SE_ASSIGN_OR_RETURN(RopeParams rope, parse_rope(hf, c.head_dim, c.max_position_embeddings));
  // A YaRN model serves factor times its trained context (vLLM derives its max_model_len the same way); configs
  // such as Qwen3's keep the trained max_position_embeddings and add the scaling by hand.
  if (rope.scaling == RopeScaling::kYarn) {
    const double served = std::round(double{rope.factor} * rope.original_max_position);
    if (served > INT32_MAX) return invalid_argument("config: yarn serves {} positions, over 2^31", served);
    c.max_position_embeddings = std::max(c.max_position_embeddings, static_cast<int>(served));
  }
  c.layers.assign(static_cast<size_t>(c.num_layers), LayerConfig{false, false, rope});
  SE_RETURN_IF_ERROR(spec->configure(hf, c));
  return c;
}

}  // namespace se
