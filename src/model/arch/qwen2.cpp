// Qwen2/Qwen2.5: the Llama block with biases on the q/k/v projections.
#include <array>

#include "model/arch/arch_registry.h"
#include "model/arch/llama.h"

namespace se {

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"qwen2"};
Status configure(const nlohmann::json&, ModelConfig& config) {
  config.attention_bias = true;
  return Status::ok();
}
}  // namespace

const ArchSpec kQwen2Arch{"qwen2", kModelTypes, &configure, &llama_block};

}  // namespace se
