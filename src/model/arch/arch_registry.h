// The architecture registry: one entry per supported architecture (one file each under model/arch/), found by
// the HF `model_type` or the GGUF `general.architecture`. An entry owns everything about its architecture:
// its config (HF keys it defaults and checks, GGUF metadata it reads, the typed ModelConfig fields it fills;
// the common fields are read once in hf_config.cpp / gguf_model.cpp / config.cpp), its weights (names, shapes,
// GGUF names, and the transforms from a checkpoint's layout to the canonical one), and the block function the
// forward runs for each layer, composed from model/layers/. Nothing outside model/arch/ names an architecture.
// Read-only after static initialization.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loader/gguf_file.h"
#include "model/config.h"
#include "model/layers/block_inputs.h"
#include "model/weight_spec.h"

namespace se {

struct ArchSpec {
  std::string_view name;
  std::span<const std::string_view> model_types;  // HF config.json `model_type` values it serves
  std::string_view hf_architecture;               // the `architectures` entry of a normalized config
  std::string_view gguf_architecture;             // GGUF `general.architecture`
  // Completes a raw HF config before the common keys are validated: the architecture's defaults, and its
  // nesting (a multimodal config's text part). `source` names the file in errors.
  Status (*prepare_hf)(nlohmann::json& hf, const std::string& source);
  // Validates and completes the architecture's own keys of a config whose common keys are normalized.
  Status (*finish_hf)(nlohmann::json& hf, const std::string& source);
  // Writes the architecture's own HF-style keys read from GGUF metadata into `hf` (which holds the common ones).
  Status (*from_gguf_metadata)(const GgufFile& file, nlohmann::json& hf);
  // Fills the architecture-specific fields of `config` (which already holds the common ones).
  Status (*configure)(const nlohmann::json& hf, ModelConfig& config);
  // Appends the weights of decoder layer `layer` (WeightSpec names and shapes) to `specs`.
  void (*layer_weights)(const ModelConfig& config, int layer, std::vector<WeightSpec>& specs);
  // A GGUF tensor (dequantized) in the canonical layout; nullptr when llama.cpp stores them unchanged.
  Tensor (*from_gguf_tensor)(const ModelConfig& config, const WeightSpec& spec, Tensor t);
  // A safetensors tensor in the canonical layout; nullptr when HF stores them unchanged.
  Tensor (*from_hf_tensor)(const WeightSpec& spec, Tensor t);
  // One decoder block of this architecture.
  BlockFn block;
};

// The spec serving `model_type` / GGUF `architecture`, or nullptr.
const ArchSpec* find_arch(std::string_view model_type);
const ArchSpec* find_gguf_arch(std::string_view architecture);
// The spec a parsed config names (config.arch): never null.
const ArchSpec& arch_of(const ModelConfig& config);
// "llama, qwen2, ..." for errors listing what is supported: model types, or GGUF architectures.
std::string supported_model_types();
std::string supported_gguf_architectures();

// Per-architecture entries (defined in arch/<name>.cpp).
extern const ArchSpec kLlamaArch;
extern const ArchSpec kQwen2Arch;
extern const ArchSpec kQwen3Arch;
extern const ArchSpec kQwen3MoeArch;
extern const ArchSpec kGemma3Arch;
extern const ArchSpec kDeepseekV2Arch;

}  // namespace se
