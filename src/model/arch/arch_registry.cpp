#include "model/arch/arch_registry.h"

#include <array>

namespace se {

namespace {
constexpr std::array<const ArchSpec*, 4> kArchs = {&kLlamaArch, &kQwen2Arch, &kQwen3Arch, &kGemma3Arch};
}

const ArchSpec* find_arch(std::string_view model_type) {
  for (const ArchSpec* spec : kArchs)
    for (std::string_view t : spec->model_types)
      if (t == model_type) return spec;
  return nullptr;
}

std::span<const ArchSpec* const> all_archs() { return kArchs; }

}  // namespace se
