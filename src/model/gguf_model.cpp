#include "model/gguf_model.h"

#include <cmath>
#include <numbers>
#include <set>
#include <vector>

#include "loader/gguf_dequant.h"
#include "loader/weight_transforms.h"
#include "model/arch/arch_registry.h"
#include "model/hf_config.h"
#include "model/weight_spec.h"

namespace se {

namespace {

using nlohmann::json;

// llama.cpp's converter stores llama3 rope scaling as per-pair divisors of the rotary frequencies.
std::vector<double> llama3_factors(double base, int64_t head_dim, double factor, double low, double high,
                                   double original_context) {
  std::vector<double> out;
  const double low_wavelen = original_context / low;
  const double high_wavelen = original_context / high;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(base, static_cast<double>(i) / static_cast<double>(head_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0);
    } else if (wavelen > low_wavelen) {
      out.push_back(factor);
    } else {
      const double smooth = (original_context / wavelen - low) / (high - low);
      out.push_back(1.0 / ((1 - smooth) / factor + smooth));
    }
  }
  return out;
}

// Turns a rope_freqs tensor into config: llama3 parameters when the standard formula reproduces it,
// else the raw factors.
Status rope_freqs_to_config(const GgufFile& file, const GgufTensorInfo& info, const std::string& arch, json& c) {
  SE_ASSIGN_OR_RETURN(Tensor t, dequantize_tensor(info));
  const int64_t head_dim = c["head_dim"].get<int64_t>();
  if (t.numel() != head_dim / 2) {
    return data_loss("{}: rope_freqs.weight has {} values, expected head_dim / 2 = {}", file.path(), t.numel(),
                     head_dim / 2);
  }
  std::vector<double> factors(t.data<float>(), t.data<float>() + t.numel());
  double factor = 1.0;
  for (double f : factors) factor = std::max(factor, f);
  const double original = file.find_u32(arch + ".rope.scaling.original_context_length").value_or(8192);
  const std::vector<double> fit = llama3_factors(c["rope_theta"].get<double>(), head_dim, factor, 1.0, 4.0, original);
  bool matches = true;
  for (size_t i = 0; i < fit.size(); ++i) matches &= std::abs(fit[i] - factors[i]) <= 1e-4 * fit[i];
  if (matches) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", factor},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", static_cast<int64_t>(original)}};
  } else {
    c["rope_freq_factors"] = factors;
  }
  return Status::ok();
}

Result<json> rope_scaling_from_metadata(const GgufFile& file, const std::string& arch) {
  std::optional<std::string> type = file.find_string(arch + ".rope.scaling.type");
  std::optional<float> factor = file.find_f32(arch + ".rope.scaling.factor");
  if (!type && file.find_f32(arch + ".rope.scale_linear")) {  // older files
    type = "linear";
    factor = file.find_f32(arch + ".rope.scale_linear");
  }
  if (!type || *type == "none" || (factor && *factor == 1.0f && *type == "linear")) return json(nullptr);
  if (!factor) return data_loss("{}: rope scaling \"{}\" without {}.rope.scaling.factor", file.path(), *type, arch);
  if (*type == "linear") return json{{"rope_type", "linear"}, {"factor", *factor}};
  if (*type == "yarn") {
    json s = {{"rope_type", "yarn"}, {"factor", *factor}};
    if (auto orig = file.find_u32(arch + ".rope.scaling.original_context_length")) {
      s["original_max_position_embeddings"] = *orig;
    }
    // llama.cpp's attn_factor multiplies YaRN's own 0.1 ln(factor) + 1; transformers' attention_factor replaces it.
    if (auto attn = file.find_f32(arch + ".rope.scaling.attn_factor"))
      s["attention_factor"] = *attn * (*factor > 1.0 ? 0.1 * std::log(*factor) + 1.0 : 1.0);
    if (auto beta = file.find_f32(arch + ".rope.scaling.yarn_beta_fast")) s["beta_fast"] = *beta;
    if (auto beta = file.find_f32(arch + ".rope.scaling.yarn_beta_slow")) s["beta_slow"] = *beta;
    return s;
  }
  return unimplemented("{}: rope scaling type \"{}\" is not supported (linear, yarn)", file.path(), *type);
}

}  // namespace

Result<json> gguf_hf_config(const GgufFile& file) {
  const std::string arch = file.architecture();
  const ArchSpec* known = find_gguf_arch(arch);
  if (known == nullptr) {
    return unimplemented("{}: GGUF architecture \"{}\" is not supported ({})", file.path(), arch,
                         supported_gguf_architectures());
  }
  auto key = [&arch](const char* suffix) { return arch + "." + suffix; };
  json c;
  c["model_type"] = std::string(known->model_types[0]);
  SE_ASSIGN_OR_RETURN(uint32_t hidden, file.get_u32(key("embedding_length")));
  SE_ASSIGN_OR_RETURN(uint32_t layers, file.get_u32(key("block_count")));
  SE_ASSIGN_OR_RETURN(uint32_t inter, file.get_u32(key("feed_forward_length")));
  SE_ASSIGN_OR_RETURN(uint32_t heads, file.get_u32(key("attention.head_count")));
  SE_ASSIGN_OR_RETURN(uint32_t context, file.get_u32(key("context_length")));
  SE_ASSIGN_OR_RETURN(float eps, file.get_f32(key("attention.layer_norm_rms_epsilon")));
  const uint32_t kv_heads = file.find_u32(key("attention.head_count_kv")).value_or(heads);
  if (heads == 0) return data_loss("{}: {} is 0", file.path(), key("attention.head_count"));
  const uint32_t head_dim = file.find_u32(key("attention.key_length")).value_or(hidden / heads);
  if (auto v = file.find_u32(key("attention.value_length")); v && *v != head_dim) {
    return unimplemented("{}: value_length {} differs from key_length {}", file.path(), *v, head_dim);
  }
  c["hidden_size"] = hidden;
  c["num_hidden_layers"] = layers;
  c["intermediate_size"] = inter;
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = kv_heads;
  c["head_dim"] = head_dim;
  c["max_position_embeddings"] = context;
  c["rms_norm_eps"] = eps;
  c["rope_theta"] = file.find_f32(key("rope.freq_base")).value_or(10000.0f);
  SE_ASSIGN_OR_RETURN(c["rope_scaling"], rope_scaling_from_metadata(file, arch));

  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  const GgufTensorInfo* embed = file.find_tensor("token_embd.weight");
  if (tokens != nullptr && tokens->is_array()) {
    c["vocab_size"] = tokens->count();
  } else if (auto v = file.find_u32(key("vocab_size"))) {
    c["vocab_size"] = *v;
  } else if (embed != nullptr && embed->dims.size() == 2) {
    c["vocab_size"] = embed->dims[1];
  } else {
    return data_loss("{}: cannot tell the vocabulary size (no tokenizer.ggml.tokens, {}, or token_embd.weight)",
                     file.path(), key("vocab_size"));
  }
  c["tie_word_embeddings"] = file.find_tensor("output.weight") == nullptr;
  for (const auto& [gguf_key, hf_key] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                         std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                         std::pair{"tokenizer.ggml.padding_token_id", "pad_token_id"}}) {
    if (auto id = file.find_u32(gguf_key)) c[hf_key] = *id;
  }
  if (file.find_tensor("blk.0.attn_q.bias") != nullptr) c["attention_bias"] = true;

  if (known->from_gguf_metadata != nullptr) SE_RETURN_IF_ERROR(known->from_gguf_metadata(file, c));
  if (const GgufTensorInfo* freqs = file.find_tensor("rope_freqs.weight")) {
    SE_RETURN_IF_ERROR(rope_freqs_to_config(file, *freqs, arch, c));
  }
  return normalize_hf_config(c, file.path());
}

Status stream_gguf_weights(const GgufFile& file, const ModelConfig& config, DType dtype, WeightSink& sink,
                           ProgressBar* progress) {
  const ArchSpec& arch = arch_of(config);
  std::set<std::string> used = {"rope_freqs.weight"};
  for (const WeightSpec& spec : expected_weights(config)) {
    const std::string& name = spec.gguf_name;
    const GgufTensorInfo* info = file.find_tensor(name);
    if (info == nullptr) return data_loss("{}: missing tensor '{}' ({})", file.path(), name, spec.name);
    const Shape shape(info->dims.rbegin(), info->dims.rend());
    if (!(shape == spec.shape)) {
      return data_loss("{}: tensor '{}' has shape {} but the model config implies {}", file.path(), name,
                       shape.to_string(), spec.shape.to_string());
    }
    Result<Tensor> t = dequantize_tensor(*info);
    if (!t.is_ok()) return t.status().with_context(file.path());
    Tensor w = std::move(t).value();
    if (arch.from_gguf_tensor != nullptr) w = arch.from_gguf_tensor(config, spec, std::move(w));
    Tensor cast = cast_weight(w, dtype);
    w = Tensor();  // the sink may free the weight at once
    SE_RETURN_IF_ERROR(sink.put(spec, std::move(cast)));
    used.insert(name);
    if (progress != nullptr) progress->advance();
  }
  for (const GgufTensorInfo& t : file.tensors()) {
    if (!used.count(t.name)) {
      return unimplemented("{}: tensor '{}' is not part of the {} model this loader knows", file.path(), t.name,
                           file.architecture());
    }
  }
  return Status::ok();
}

}  // namespace se
