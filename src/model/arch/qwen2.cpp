// Qwen2/Qwen2.5: the Llama block with biases on the q/k/v projections.
#include <array>

#include <nlohmann/json.hpp>

#include "model/arch/arch_registry.h"
#include "model/arch/llama.h"
#include "model/config_json.h"

namespace se {

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"qwen2"};

// Qwen2's q/k/v projections carry biases unless the config says otherwise.
Status prepare_hf(nlohmann::json& hf, const std::string&) {
  if (!hf.contains("attention_bias") || hf["attention_bias"].is_null()) hf["attention_bias"] = true;
  return Status::ok();
}

Status configure(const nlohmann::json& hf, ModelConfig& config) {
  SE_ASSIGN_OR_RETURN(config.attention_bias, config_json::bool_or(hf, "attention_bias", true));
  return Status::ok();
}
}  // namespace

const ArchSpec kQwen2Arch{.name = "qwen2",
                          .model_types = kModelTypes,
                          .hf_architecture = "Qwen2ForCausalLM",
                          .gguf_architecture = "qwen2",
                          .prepare_hf = &prepare_hf,
                          .finish_hf = &llama_finish_hf,
                          .from_gguf_metadata = nullptr,
                          .configure = &configure,
                          .layer_weights = &llama_layer_weights,
                          .from_gguf_tensor = nullptr,
                          .from_hf_tensor = nullptr,
                          .block = &llama_block};

}  // namespace se
