// Qwen3 (dense): the Llama block with per-head RMSNorm on q and k before RoPE, and no q/k/v biases.
#include <array>

#include "model/arch/arch_registry.h"
#include "model/arch/llama.h"

namespace se {

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"qwen3"};
Status configure(const nlohmann::json&, ModelConfig& config) {
  config.qk_norm = true;
  return Status::ok();
}
}  // namespace

const ArchSpec kQwen3Arch{.name = "qwen3",
                          .model_types = kModelTypes,
                          .hf_architecture = "Qwen3ForCausalLM",
                          .gguf_architecture = "qwen3",
                          .prepare_hf = nullptr,
                          .finish_hf = &llama_finish_hf,
                          .from_gguf_metadata = nullptr,
                          .configure = &configure,
                          .layer_weights = &llama_layer_weights,
                          .from_gguf_tensor = nullptr,
                          .from_hf_tensor = nullptr,
                          .block = &llama_block};

}  // namespace se
