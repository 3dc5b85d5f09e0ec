#include "loader/hf_config.h"

#include <optional>

namespace se {

namespace {

using nlohmann::json;

// Upper bounds that no real model reaches; they stop a corrupted config from asking for absurd
// allocations.
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden, intermediate, head_dim
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 30;

struct ArchInfo {
  const char* model_type;
  const char* architecture;
  ModelArch arch;
};

constexpr ArchInfo kArchs[] = {
    {"llama", "LlamaForCausalLM", ModelArch::kLlama},
    {"qwen2", "Qwen2ForCausalLM", ModelArch::kQwen2},
    {"qwen3", "Qwen3ForCausalLM", ModelArch::kQwen3},
    {"gemma3_text", "Gemma3ForCausalLM", ModelArch::kGemma3},
};

const ArchInfo* find_arch(const std::string& model_type) {
  for (const ArchInfo& a : kArchs) {
    if (model_type == a.model_type) return &a;
  }
  return nullptr;
}

// Reads an integer in [1, max]; absent keys take `fallback` when given.
Result<int64_t> read_size(const json& c, const char* key, int64_t max, const std::string& source,
                          std::optional<int64_t> fallback = std::nullopt) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) {
    if (fallback) return *fallback;
    return invalid_argument("{}: missing required key \"{}\"", source, key);
  }
  if (!it->is_number_integer())
    return invalid_argument("{}: \"{}\" must be an integer, got {}", source, key, it->dump());
  const int64_t v = it->get<int64_t>();
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max)) {
    return invalid_argument("{}: \"{}\" = {} is out of range [1, {}]", source, key, it->dump(),
                            max);
  }
  if (v < 1 || v > max)
    return invalid_argument("{}: \"{}\" = {} is out of range [1, {}]", source, key, v, max);
  return v;
}

// Reads a positive finite number; absent keys take `fallback`.
Result<double> read_positive(const json& c, const char* key, double fallback,
                             const std::string& source) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_number())
    return invalid_argument("{}: \"{}\" must be a number, got {}", source, key, it->dump());
  const double v = it->get<double>();
  if (!(v > 0) || v > 1e30)
    return invalid_argument("{}: \"{}\" = {} must be positive", source, key, v);
  return v;
}

Result<bool> read_bool(const json& c, const char* key, bool fallback, const std::string& source) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    return invalid_argument("{}: \"{}\" must be true or false, got {}", source, key, it->dump());
  return it->get<bool>();
}

// Normalizes a rope_scaling object ("type" -> "rope_type") and checks the fields its type needs.
Result<json> normalize_rope_scaling(json scaling, const std::string& source) {
  if (scaling.is_null()) return json(nullptr);
  if (!scaling.is_object())
    return invalid_argument("{}: \"rope_scaling\" must be an object or null", source);
  if (!scaling.contains("rope_type") && scaling.contains("type"))
    scaling["rope_type"] = scaling["type"];
  scaling.erase("type");
  scaling.erase("rope_theta");
  if (!scaling.contains("rope_type") || !scaling["rope_type"].is_string()) {
    return invalid_argument("{}: \"rope_scaling\" needs a string \"rope_type\"", source);
  }
  const std::string type = scaling["rope_type"].get<std::string>();
  if (type == "default") return json(nullptr);
  std::vector<const char*> needed;
  if (type == "linear") {
    needed = {"factor"};
  } else if (type == "llama3") {
    needed = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
  } else if (type == "yarn") {
    needed = {"factor"};
  } else {
    return unimplemented("{}: rope_scaling type \"{}\" is not supported (linear, llama3, yarn)",
                         source, type);
  }
  for (const char* key : needed) {
    SE_ASSIGN_OR_RETURN(double v, read_positive(scaling, key, -1.0, source));
    if (v < 0)
      return invalid_argument("{}: rope_scaling of type \"{}\" needs \"{}\"", source, type, key);
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
    if (params.contains("sliding_attention"))
      apply(params["sliding_attention"], "rope_local_base_freq", false);
  } else {
    apply(params, "rope_theta", true);
  }
}

Status normalize_gemma3(json& c, int64_t num_layers, int64_t head_dim, const std::string& source) {
  SE_ASSIGN_OR_RETURN(int64_t window, read_size(c, "sliding_window", kMaxPositions, source, 4096));
  int64_t pattern = 6;
  if (c.contains("sliding_window_pattern") && !c["sliding_window_pattern"].is_null()) {
    SE_ASSIGN_OR_RETURN(pattern, read_size(c, "sliding_window_pattern", kMaxLayers, source));
  } else if (c.contains("_sliding_window_pattern")) {
    SE_ASSIGN_OR_RETURN(pattern, read_size(c, "_sliding_window_pattern", kMaxLayers, source));
  }
  c.erase("_sliding_window_pattern");
  json layer_types = json::array();
  if (c.contains("layer_types") && !c["layer_types"].is_null()) {
    layer_types = c["layer_types"];
    if (!layer_types.is_array() || static_cast<int64_t>(layer_types.size()) != num_layers) {
      return invalid_argument("{}: \"layer_types\" must list one entry per layer ({})", source,
                              num_layers);
    }
    for (const json& t : layer_types) {
      if (t != "sliding_attention" && t != "full_attention") {
        return invalid_argument("{}: unknown layer type {} in \"layer_types\"", source, t.dump());
      }
    }
  } else {
    // Every pattern-th layer attends globally, the rest use the sliding window.
    for (int64_t i = 0; i < num_layers; ++i) {
      layer_types.push_back((i + 1) % pattern == 0 ? "full_attention" : "sliding_attention");
    }
  }
  SE_ASSIGN_OR_RETURN(double local_base, read_positive(c, "rope_local_base_freq", 10000.0, source));
  SE_ASSIGN_OR_RETURN(double scalar, read_positive(c, "query_pre_attn_scalar",
                                                   static_cast<double>(head_dim), source));
  c["sliding_window"] = window;
  c["sliding_window_pattern"] = pattern;
  c["layer_types"] = layer_types;
  c["rope_local_base_freq"] = local_base;
  c["query_pre_attn_scalar"] = scalar;
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    if (!c.contains(key)) c[key] = nullptr;
    if (!c[key].is_null()) SE_RETURN_IF_ERROR(read_positive(c, key, 1.0, source).status());
  }
  if (!c.contains("hidden_activation") || c["hidden_activation"].is_null()) {
    c["hidden_activation"] = c.value("hidden_act", json("gelu_pytorch_tanh"));
  }
  if (c["hidden_activation"] != "gelu_pytorch_tanh") {
    return unimplemented("{}: gemma3 hidden_activation {} is not supported", source,
                         c["hidden_activation"].dump());
  }
  return Status::ok();
}

}  // namespace

Result<json> normalize_hf_config(const json& config, const std::string& source) {
  if (!config.is_object()) return invalid_argument("{}: config must be a JSON object", source);
  json c = config;
  // A multimodal Gemma 3 config keeps the language model's settings in text_config.
  if (c.value("model_type", json()).is_string() && c["model_type"] == "gemma3" &&
      c.contains("text_config")) {
    json text = c["text_config"];
    if (!text.is_object()) return invalid_argument("{}: \"text_config\" must be an object", source);
    for (const char* key :
         {"bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"}) {
      if (c.contains(key) && !text.contains(key)) text[key] = c[key];
    }
    text["model_type"] = "gemma3_text";
    c = std::move(text);
  }
  if (!c.contains("model_type") || !c["model_type"].is_string()) {
    return invalid_argument("{}: missing string \"model_type\"", source);
  }
  const std::string model_type = c["model_type"].get<std::string>();
  const ArchInfo* arch = find_arch(model_type);
  if (arch == nullptr) {
    return unimplemented(
        "{}: model_type \"{}\" is not supported (llama, qwen2, qwen3, gemma3_text)", source,
        model_type);
  }
  const bool gemma = arch->arch == ModelArch::kGemma3;
  fold_rope_parameters(c);

  SE_ASSIGN_OR_RETURN(int64_t hidden, read_size(c, "hidden_size", kMaxWidth, source));
  SE_ASSIGN_OR_RETURN(int64_t inter, read_size(c, "intermediate_size", kMaxWidth, source));
  SE_ASSIGN_OR_RETURN(int64_t layers, read_size(c, "num_hidden_layers", kMaxLayers, source));
  SE_ASSIGN_OR_RETURN(int64_t heads, read_size(c, "num_attention_heads", kMaxHeads, source));
  SE_ASSIGN_OR_RETURN(int64_t kv_heads,
                      read_size(c, "num_key_value_heads", kMaxHeads, source, heads));
  SE_ASSIGN_OR_RETURN(int64_t vocab, read_size(c, "vocab_size", kMaxVocab, source));
  if (heads % kv_heads != 0) {
    return invalid_argument(
        "{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", source, heads,
        kv_heads);
  }
  std::optional<int64_t> default_head_dim;
  if (gemma) {
    default_head_dim = 256;
  } else if (hidden % heads == 0) {
    default_head_dim = hidden / heads;
  }
  if (!default_head_dim && (!c.contains("head_dim") || c["head_dim"].is_null())) {
    return invalid_argument(
        "{}: hidden_size ({}) is not a multiple of num_attention_heads ({}) and no head_dim is "
        "given",
        source, hidden, heads);
  }
  SE_ASSIGN_OR_RETURN(int64_t head_dim,
                      read_size(c, "head_dim", kMaxWidth, source, default_head_dim));
  if (head_dim % 2 != 0)
    return invalid_argument("{}: head_dim ({}) must be even for rotary embeddings", source,
                            head_dim);
  SE_ASSIGN_OR_RETURN(int64_t positions, read_size(c, "max_position_embeddings", kMaxPositions,
                                                   source, gemma ? 131072 : 2048));
  SE_ASSIGN_OR_RETURN(double eps, read_positive(c, "rms_norm_eps", 1e-6, source));
  SE_ASSIGN_OR_RETURN(double theta, read_positive(c, "rope_theta", gemma ? 1e6 : 10000.0, source));
  SE_ASSIGN_OR_RETURN(bool tie, read_bool(c, "tie_word_embeddings", gemma, source));
  SE_ASSIGN_OR_RETURN(bool bias,
                      read_bool(c, "attention_bias", arch->arch == ModelArch::kQwen2, source));
  SE_ASSIGN_OR_RETURN(json scaling,
                      normalize_rope_scaling(c.value("rope_scaling", json(nullptr)), source));

  c["architectures"] = json::array({arch->architecture});
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
  if (gemma) {
    SE_RETURN_IF_ERROR(normalize_gemma3(c, layers, head_dim, source));
  } else {
    if (!c.contains("hidden_act") || c["hidden_act"].is_null()) c["hidden_act"] = "silu";
    if (c["hidden_act"] != "silu") {
      return unimplemented("{}: hidden_act {} is not supported (silu)", source,
                           c["hidden_act"].dump());
    }
  }
  return c;
}

ModelDims model_dims(const json& c) {
  ModelDims d;
  d.arch = find_arch(c.at("model_type").get<std::string>())->arch;
  d.hidden_size = c.at("hidden_size").get<int64_t>();
  d.intermediate_size = c.at("intermediate_size").get<int64_t>();
  d.num_layers = c.at("num_hidden_layers").get<int64_t>();
  d.num_heads = c.at("num_attention_heads").get<int64_t>();
  d.num_kv_heads = c.at("num_key_value_heads").get<int64_t>();
  d.head_dim = c.at("head_dim").get<int64_t>();
  d.vocab_size = c.at("vocab_size").get<int64_t>();
  d.tie_word_embeddings = c.at("tie_word_embeddings").get<bool>();
  d.attention_bias = c.at("attention_bias").get<bool>();
  d.qk_norm = d.arch == ModelArch::kQwen3 || d.arch == ModelArch::kGemma3;
  d.sandwich_norm = d.arch == ModelArch::kGemma3;
  return d;
}

}  // namespace se
