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

const ArchSpec kQwen3Arch{"qwen3", kModelTypes, &configure, &llama_block};

}  // namespace se
