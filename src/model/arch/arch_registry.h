// The architecture registry: one entry per supported architecture (one file each under model/arch/), found
// by the HF `model_type`. An entry fills the architecture-specific parts of ModelConfig (the common fields are
// read once in config.cpp) and names the block function the forward runs for each layer, composed from
// model/layers/. Read-only after static initialization.
#pragma once

#include <span>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "model/config.h"
#include "model/layers/block_inputs.h"

namespace se {

struct ArchSpec {
  std::string_view name;
  std::span<const std::string_view> model_types;  // HF config.json `model_type` values it serves
  // Fills the architecture-specific fields of `config` (which already holds the common ones).
  Status (*configure)(const nlohmann::json& hf, ModelConfig& config);
  // One decoder block of this architecture.
  BlockFn block;
};

// Returns the spec serving `model_type`, or nullptr.
const ArchSpec* find_arch(std::string_view model_type);
std::span<const ArchSpec* const> all_archs();

// Per-architecture entries (defined in arch/<name>.cpp).
extern const ArchSpec kLlamaArch;
extern const ArchSpec kQwen2Arch;
extern const ArchSpec kQwen3Arch;
extern const ArchSpec kGemma3Arch;

}  // namespace se
