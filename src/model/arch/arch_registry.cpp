#include "model/arch/arch_registry.h"

#include <array>

#include "base/check.h"

namespace se {

namespace {
constexpr std::array<const ArchSpec*, 6> kArchs = {&kLlamaArch,    &kQwen2Arch,  &kQwen3Arch,
                                                   &kQwen3MoeArch, &kGemma3Arch, &kDeepseekV2Arch};
}

const ArchSpec* find_arch(std::string_view model_type) {
  for (const ArchSpec* spec : kArchs)
    for (std::string_view t : spec->model_types)
      if (t == model_type) return spec;
  return nullptr;
}

const ArchSpec* find_gguf_arch(std::string_view architecture) {
  for (const ArchSpec* spec : kArchs)
    if (spec->gguf_architecture == architecture) return spec;
  return nullptr;
}

const ArchSpec& arch_of(const ModelConfig& config) {
  for (const ArchSpec* spec : kArchs)
    if (spec->name == config.arch) return *spec;
  SE_CHECK(false, "config names no registered architecture: '{}'", config.arch);
  return *kArchs[0];
}

std::string supported_model_types() {
  std::string out;
  for (const ArchSpec* spec : kArchs) out += (out.empty() ? "" : ", ") + std::string(spec->model_types[0]);
  return out;
}

std::string supported_gguf_architectures() {
  std::string out;
  for (const ArchSpec* spec : kArchs) out += (out.empty() ? "" : ", ") + std::string(spec->gguf_architecture);
  return out;
}

}  // namespace se
