#include "model/hf_config.h"

#include <optional>

#include "model/arch/arch_registry.h"

namespace se {

using nlohmann::json;

Result<int64_t> read_size(const json& c, const char* key, int64_t max, const std::string& source,
                          std::optional<int64_t> fallback) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) {
    if (fallback) return *fallback;
    return invalid_argument("{}: missing required key \"{}\"", source, key);
  }
  if (!it->is_number_integer())
    return invalid_argument("{}: \"{}\" must be an integer, got {}", source, key, it->dump());
  const int64_t v = it->get<int64_t>();
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max)) {
    return invalid_argument("{}: \"{}\" = {} is out of range [1, {}]", source, key, it->dump(), max);
  }
  if (v < 1 || v > max) return invalid_argument("{}: \"{}\" = {} is out of range [1, {}]", source, key, v, max);
  return v;
}

Result<double> read_positive(const json& c, const char* key, double fallback, const std::string& source) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_number()) return invalid_argument("{}: \"{}\" must be a number, got {}", source, key, it->dump());
  const double v = it->get<double>();
  if (!(v > 0) || v > 1e30) return invalid_argument("{}: \"{}\" = {} must be positive", source, key, v);
  return v;
}

Result<bool> read_bool(const json& c, const char* key, bool fallback, const std::string& source) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return invalid_argument("{}: \"{}\" must be true or false, got {}", source, key, it->dump());
  return it->get<bool>();
}

namespace {

constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxVocab = int64_t{1} << 24;

// Normalizes a rope_scaling object ("type" -> "rope_type") and checks the fields its type needs.
Result<json> normalize_rope_scaling(json scaling, const std::string& source) {
  if (scaling.is_null()) return json(nullptr);
  if (!scaling.is_object()) return invalid_argument("{}: \"rope_scaling\" must be an object or null", source);
  if (!scaling.contains("rope_type") && scaling.contains("type")) scaling["rope_type"] = scaling["type"];
  scaling.erase("type");
  scaling.erase("rope_theta");
  if (!scaling.contains("rope_type") || !scaling["rope_type"].is_string()) {
    return invalid_argument("{}: \"rope_scaling\" needs a string \"rope_type\"", source);
  }
  const std::string type = scaling["rope_type"].get<std::string>();
  if (type == "default") return json(nullptr);
  std::vector<const char*> needed;
  if (type == "linear" || type == "yarn") {
    needed = {"factor"};
  } else if (type == "llama3") {
    needed = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
  } else {
    return unimplemented("{}: rope_scaling type \"{}\" is not supported (linear, llama3, yarn)", source, type);
  }
  for (const char* key : needed) {
    SE_ASSIGN_OR_RETURN(double v, read_positive(scaling, key, -1.0, source));
    if (v < 0) return invalid_argument("{}: rope_scaling of type \"{}\" needs \"{}\"", source, type, key);
  }
  return scaling;
}

// Folds transformers-5 `rope_parameters` into the classic keys.
void fold_rope_parameters(json& c) {
  auto it = c.find("rope_parameters");
  if (it == c.end() || !it->is_object()) return;
  json params = *it;
  c.erase("rope_parameters");
  auto apply = [&c](const json& p, const char* theta_key, bool scaling) {
    if (p.contains("rope_theta")) c[theta_key] = p["rope_theta"];
    if (scaling && !c.contains("rope_scaling")) c["rope_scaling"] = p;
  };
  if (params.contains("full_attention") || params.contains("sliding_attention")) {
    if (params.contains("full_attention")) apply(params["full_attention"], "rope_theta", true);
    if (params.contains("sliding_attention")) apply(params["sliding_attention"], "rope_local_base_freq", false);
  } else {
    apply(params, "rope_theta", true);
  }
}

}  // namespace

Result<json> normalize_hf_config(const json& config, const std::string& source) {
  if (!config.is_object()) return invalid_argument("{}: config must be a JSON object", source);
  json c = config;
  if (!c.contains("model_type") || !c["model_type"].is_string()) {
    return invalid_argument("{}: missing string \"model_type\"", source);
  }
  const std::string model_type = c["model_type"].get<std::string>();
  const ArchSpec* arch = find_arch(model_type);
  if (arch == nullptr) {
    return unimplemented("{}: model_type \"{}\" is not supported ({})", source, model_type, supported_model_types());
  }
  if (arch->prepare_hf != nullptr) SE_RETURN_IF_ERROR(arch->prepare_hf(c, source));
  fold_rope_parameters(c);

  SE_ASSIGN_OR_RETURN(int64_t hidden, read_size(c, "hidden_size", kMaxConfigWidth, source));
  SE_ASSIGN_OR_RETURN(int64_t inter, read_size(c, "intermediate_size", kMaxConfigWidth, source));
  SE_ASSIGN_OR_RETURN(int64_t layers, read_size(c, "num_hidden_layers", kMaxConfigLayers, source));
  SE_ASSIGN_OR_RETURN(int64_t heads, read_size(c, "num_attention_heads", kMaxHeads, source));
  SE_ASSIGN_OR_RETURN(int64_t kv_heads, read_size(c, "num_key_value_heads", kMaxHeads, source, heads));
  SE_ASSIGN_OR_RETURN(int64_t vocab, read_size(c, "vocab_size", kMaxVocab, source));
  if (heads % kv_heads != 0) {
    return invalid_argument("{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", source, heads,
                            kv_heads);
  }
  std::optional<int64_t> default_head_dim;
  if (hidden % heads == 0) default_head_dim = hidden / heads;
  if (!default_head_dim && (!c.contains("head_dim") || c["head_dim"].is_null())) {
    return invalid_argument(
        "{}: hidden_size ({}) is not a multiple of num_attention_heads ({}) and no head_dim is "
        "given",
        source, hidden, heads);
  }
  SE_ASSIGN_OR_RETURN(int64_t head_dim, read_size(c, "head_dim", kMaxConfigWidth, source, default_head_dim));
  if (head_dim % 2 != 0)
    return invalid_argument("{}: head_dim ({}) must be even for rotary embeddings", source, head_dim);
  SE_ASSIGN_OR_RETURN(int64_t positions, read_size(c, "max_position_embeddings", kMaxConfigPositions, source, 2048));
  SE_ASSIGN_OR_RETURN(double eps, read_positive(c, "rms_norm_eps", 1e-6, source));
  SE_ASSIGN_OR_RETURN(double theta, read_positive(c, "rope_theta", 10000.0, source));
  SE_ASSIGN_OR_RETURN(bool tie, read_bool(c, "tie_word_embeddings", false, source));
  SE_ASSIGN_OR_RETURN(bool bias, read_bool(c, "attention_bias", false, source));
  SE_ASSIGN_OR_RETURN(json scaling, normalize_rope_scaling(c.value("rope_scaling", json(nullptr)), source));

  c["architectures"] = json::array({std::string(arch->hf_architecture)});
  c["hidden_size"] = hidden;
  c["intermediate_size"] = inter;
  c["num_hidden_layers"] = layers;
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = kv_heads;
  c["head_dim"] = head_dim;
  c["vocab_size"] = vocab;
  c["max_position_embeddings"] = positions;
  c["rms_norm_eps"] = eps;
  c["rope_theta"] = theta;
  c["rope_scaling"] = scaling;
  c["tie_word_embeddings"] = tie;
  c["attention_bias"] = bias;
  SE_RETURN_IF_ERROR(arch->finish_hf(c, source));
  return c;
}

Status require_silu(nlohmann::json& hf, const std::string& source) {
  if (!hf.contains("hidden_act") || hf["hidden_act"].is_null()) hf["hidden_act"] = "silu";
  if (hf["hidden_act"] != "silu")
    return unimplemented("{}: hidden_act {} is not supported (silu)", source, hf["hidden_act"].dump());
  return Status::ok();
}

}  // namespace se
