// Llama 2/3.x and SmolLM2: pre-norm blocks, SwiGLU MLP, RoPE (optionally llama3- or linearly scaled).
#include <array>

#include "model/arch/arch_registry.h"

namespace se {

namespace {
constexpr std::array<std::string_view, 1> kModelTypes = {"llama"};
Status configure(const nlohmann::json&, ModelConfig&) { return Status::ok(); }
}  // namespace

const ArchSpec kLlamaArch{"llama", kModelTypes, &configure};

}  // namespace se
