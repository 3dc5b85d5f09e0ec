// Gemma 3 (text): sandwich norms around attention and MLP, q/k RMSNorm, GeGLU (tanh GELU), embeddings scaled
// by sqrt(hidden_size), tied embeddings, and interleaved sliding-window (local RoPE base) and global layers.
#include "model/arch/gemma3.h"

#include <array>
#include <cmath>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/arch/arch_registry.h"
#include "model/config_json.h"
#include "model/hf_config.h"
#include "model/layers/attention.h"
#include "model/layers/gated_mlp.h"

namespace se {

Tensor gemma_norm_multiplier(const Tensor& w) {
  Tensor m = w.to_f32();  // always a fresh copy
  float* p = m.data<float>();
  for (int64_t i = 0; i < m.numel(); ++i) p[i] += 1.0f;
  return m;
}

namespace {
constexpr std::array<std::string_view, 2> kModelTypes = {"gemma3_text", "gemma3"};

using nlohmann::json;

// A multimodal Gemma 3 config keeps the language model's settings in text_config; Gemma's defaults differ from
// the common ones.
Status prepare_hf(json& c, const std::string& source) {
  if (c["model_type"] == "gemma3" && c.contains("text_config")) {
    json text = c["text_config"];
    if (!text.is_object()) return invalid_argument("{}: \"text_config\" must be an object", source);
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"}) {
      if (c.contains(key) && !text.contains(key)) text[key] = c[key];
    }
    text["model_type"] = "gemma3_text";
    c = std::move(text);
  }
  const auto default_to = [&c](const char* key, const json& value) {
    if (!c.contains(key) || c[key].is_null()) c[key] = value;
  };
  default_to("head_dim", 256);
  default_to("max_position_embeddings", 131072);
  default_to("rope_theta", 1e6);
  default_to("tie_word_embeddings", true);
  return Status::ok();
}

// Gemma 3's own keys, defaulted and checked: sliding window and layer types, local RoPE base, query scaling,
// soft-capping, and the GeGLU activation.
Status finish_hf(json& c, const std::string& source) {
  const int64_t num_layers = c["num_hidden_layers"].get<int64_t>();
  const int64_t head_dim = c["head_dim"].get<int64_t>();
  SE_ASSIGN_OR_RETURN(int64_t window, read_size(c, "sliding_window", kMaxConfigPositions, source, 4096));
  int64_t pattern = 6;
  if (c.contains("sliding_window_pattern") && !c["sliding_window_pattern"].is_null()) {
    SE_ASSIGN_OR_RETURN(pattern, read_size(c, "sliding_window_pattern", kMaxConfigLayers, source));
  } else if (c.contains("_sliding_window_pattern")) {
    SE_ASSIGN_OR_RETURN(pattern, read_size(c, "_sliding_window_pattern", kMaxConfigLayers, source));
  }
  c.erase("_sliding_window_pattern");
  json layer_types = json::array();
  if (c.contains("layer_types") && !c["layer_types"].is_null()) {
    layer_types = c["layer_types"];
    if (!layer_types.is_array() || static_cast<int64_t>(layer_types.size()) != num_layers) {
      return invalid_argument("{}: \"layer_types\" must list one entry per layer ({})", source, num_layers);
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
  SE_ASSIGN_OR_RETURN(double scalar, read_positive(c, "query_pre_attn_scalar", static_cast<double>(head_dim), source));
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
    return unimplemented("{}: gemma3 hidden_activation {} is not supported", source, c["hidden_activation"].dump());
  }
  return Status::ok();
}

// Gemma 3's GGUF metadata as HF keys (`hf` holds the common ones).
Status from_gguf_metadata(const GgufFile& file, json& c) {
  const auto key = [&file](const char* suffix) { return file.architecture() + "." + suffix; };
  const int64_t layers = c["num_hidden_layers"].get<int64_t>();
  const int64_t hidden = c["hidden_size"].get<int64_t>();
  const int64_t heads = c["num_attention_heads"].get<int64_t>();
  const int64_t head_dim = c["head_dim"].get<int64_t>();
  c["hidden_activation"] = "gelu_pytorch_tanh";
  if (auto w = file.find_u32(key("attention.sliding_window"))) c["sliding_window"] = *w;
  c["sliding_window_pattern"] = 6;  // fixed for Gemma 3 (llama.cpp hard-codes it too)
  c["rope_local_base_freq"] = 10000.0;
  // Gemma 3 27B scales queries by hidden/heads; every other size by head_dim (as llama.cpp decides).
  c["query_pre_attn_scalar"] = layers == 62 ? hidden / heads : head_dim;
  for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    std::optional<float> v = file.find_f32(key(cap));
    c[cap] = v ? json(*v) : json(nullptr);
  }
  return Status::ok();
}

// The norm after attention is a real post-attention norm here, and the pre-MLP norm takes llama.cpp's
// "ffn_norm" name.
void layer_weights(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs) {
  append_attention_weights(config, layer, specs);
  append_layer_norm(config, layer, "post_attention_layernorm.weight", "post_attention_norm.weight", specs);
  append_layer_norm(config, layer, "pre_feedforward_layernorm.weight", "ffn_norm.weight", specs);
  append_layer_norm(config, layer, "post_feedforward_layernorm.weight", "post_ffw_norm.weight", specs);
  append_gated_mlp_weights(config, layer, specs);
}

// llama.cpp's converter adds the one already; HF checkpoints store w.
Tensor from_hf_tensor(const WeightSpec& spec, Tensor t) {
  return spec.kind == WeightKind::kNorm ? gemma_norm_multiplier(t) : std::move(t);
}

// Which layers slide: an explicit `layer_types` list, else every `sliding_window_pattern`-th layer is global.
Status assign_layer_types(const nlohmann::json& hf, ModelConfig& config) {
  if (hf.contains("layer_types") && hf["layer_types"].is_array()) {
    const auto& types = hf["layer_types"];
    if (static_cast<int>(types.size()) != config.num_layers)
      return invalid_argument("config: layer_types has {} entries for {} layers", types.size(), config.num_layers);
    for (int i = 0; i < config.num_layers; ++i) {
      const auto& t = types[static_cast<size_t>(i)];
      if (!t.is_string()) return invalid_argument("config: layer_types[{}] must be a string", i);
      config.layers[static_cast<size_t>(i)].sliding = t.get<std::string>() == "sliding_attention";
    }
    return Status::ok();
  }
  SE_ASSIGN_OR_RETURN(int pattern, config_json::int_or(hf, "sliding_window_pattern", 6));
  if (pattern <= 0) return invalid_argument("config: sliding_window_pattern must be positive");
  for (int i = 0; i < config.num_layers; ++i) config.layers[static_cast<size_t>(i)].sliding = (i + 1) % pattern != 0;
  return Status::ok();
}

Status configure(const nlohmann::json& hf, ModelConfig& config) {
  namespace cj = config_json;
  config.qk_norm = true;
  config.sandwich_norm = true;
  config.activation = Activation::kGeluTanh;
  config.embedding_scale = std::sqrt(static_cast<float>(config.hidden_size));
  SE_ASSIGN_OR_RETURN(config.tie_word_embeddings, cj::bool_or(hf, "tie_word_embeddings", true));
  SE_ASSIGN_OR_RETURN(float query_scalar, cj::float_or(hf, "query_pre_attn_scalar", config.head_dim));
  if (query_scalar <= 0.0f) return invalid_argument("config: query_pre_attn_scalar must be positive");
  config.attention_scale = 1.0f / std::sqrt(query_scalar);
  SE_ASSIGN_OR_RETURN(config.sliding_window, cj::int_or(hf, "sliding_window", 4096));
  SE_ASSIGN_OR_RETURN(config.attn_logit_softcap, cj::float_or(hf, "attn_logit_softcapping", 0.0f));
  SE_ASSIGN_OR_RETURN(config.final_logit_softcap, cj::float_or(hf, "final_logit_softcapping", 0.0f));
  SE_RETURN_IF_ERROR(assign_layer_types(hf, config));

  // Local layers use their own RoPE base and no scaling.
  SE_ASSIGN_OR_RETURN(float local_theta, cj::float_or(hf, "rope_local_base_freq", 10000.0f));
  for (LayerConfig& layer : config.layers) {
    if (!layer.sliding) continue;
    layer.rope = RopeParams{};
    layer.rope.theta = local_theta;
    layer.rope.rotary_dim = config.head_dim;
  }
  return Status::ok();
}

// Sandwich block: attention and MLP outputs are normed before they join the residual stream, so neither add
// fuses into its GEMM; add_rms_norm fuses the attention add with the pre-MLP norm instead.
void block(const BlockInputs& in) {
  const float eps = in.config.rms_norm_eps;
  const LayerWeights& w = in.weights;
  const TensorView h = in.ws.hidden(in.t);
  const TensorView x = in.ws.normed(in.t);
  const TensorView out = in.ws.proj(in.t);
  rms_norm(x, h, w.input_norm.view(), eps);
  attention_out(in, out, x);
  rms_norm(out, out, w.post_attention_norm.view(), eps);
  add_rms_norm(x, h, out, w.pre_feedforward_norm.view(), eps);
  gated_mlp_out(in, out, x);
  rms_norm(out, out, w.post_feedforward_norm.view(), eps);
  add_inplace(h, out);
}
}  // namespace

const ArchSpec kGemma3Arch{.name = "gemma3",
                           .model_types = kModelTypes,
                           .hf_architecture = "Gemma3ForCausalLM",
                           .gguf_architecture = "gemma3",
                           .prepare_hf = &prepare_hf,
                           .finish_hf = &finish_hf,
                           .from_gguf_metadata = &from_gguf_metadata,
                           .configure = &configure,
                           .layer_weights = &layer_weights,
                           .from_gguf_tensor = nullptr,
                           .from_hf_tensor = &from_hf_tensor,
                           .block = &block};

}  // namespace se
