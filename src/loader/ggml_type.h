// GgmlType: the tensor element encodings a GGUF file may hold, with their block geometry.
// Pure functions over constant tables; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace se {

// Values match ggml's `enum ggml_type` (gguf-py GGMLQuantizationType).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  int64_t block_size;  // elements per block (1 for plain types)
  size_t type_size;    // bytes per block
};

// The geometry of a type id, or nullopt for an id this build does not know.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id);
// "Q4_K", or "type 77" for an unknown id.
std::string ggml_type_name(GgmlType type);

}  // namespace se
