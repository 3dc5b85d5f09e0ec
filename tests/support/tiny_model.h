// A tiny random decoder model for fast engine tests: real architecture code, dummy weights (seeded), small
// shapes. `weight_scale` multiplies the dummy weights so greedy decisions are far from ties.
#pragma once

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "model/hf_config.h"
#include "model/model.h"
#include "model/model_loader.h"

namespace se::test {

inline nlohmann::json tiny_config(const std::string& model_type = "llama") {
  nlohmann::json c = {{"model_type", model_type},  {"vocab_size", 96},        {"hidden_size", 64},
                      {"intermediate_size", 128},  {"num_hidden_layers", 2},  {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},  {"head_dim", 16},          {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},     {"max_position_embeddings", 2048},
                      {"tie_word_embeddings", false}};
  if (model_type == "gemma3_text") {
    c["sliding_window"] = 8;
    c["sliding_window_pattern"] = 2;
  }
  if (model_type == "deepseek_v2") {  // latent attention, a dense first layer, then experts with a shared one
    c["num_key_value_heads"] = 4;
    c["head_dim"] = 24;
    c["kv_lora_rank"] = 16;
    c["q_lora_rank"] = nullptr;
    c["qk_nope_head_dim"] = 16;
    c["qk_rope_head_dim"] = 8;
    c["v_head_dim"] = 16;
    c["n_routed_experts"] = 8;
    c["num_experts_per_tok"] = 2;
    c["moe_intermediate_size"] = 32;
    c["n_shared_experts"] = 1;
    c["first_k_dense_replace"] = 1;
  }
  if (model_type == "qwen3_moe") {
    c["num_experts"] = 8;
    c["num_experts_per_tok"] = 3;
    c["moe_intermediate_size"] = 32;
    c["norm_topk_prob"] = true;
  }
  return c;
}

inline Model tiny_model(const std::string& model_type = "llama", float weight_scale = 10.0f, uint64_t seed = 1,
                        Device device = Device::kCpu) {
  auto normalized = normalize_hf_config(tiny_config(model_type), "tiny");
  SE_CHECK(normalized.is_ok(), "{}", normalized.status().to_string());
  auto config = parse_model_config(*normalized);
  SE_CHECK(config.is_ok(), "{}", config.status().to_string());
  auto weights = dummy_weights(*config, DType::kF32, seed, nullptr);
  for (auto& [name, t] : weights) {
    if (name.find("norm") != std::string::npos) continue;
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= weight_scale;
  }
  auto model = Model::create(*config, weights, device);
  SE_CHECK(model.is_ok(), "{}", model.status().to_string());
  return std::move(model).value();
}

}  // namespace se::test
