#include "loader/ggml_type.h"

#include <array>

namespace se {

namespace {

struct TypeEntry {
  GgmlType type;
  const char* name;
  GgmlTypeTraits traits;
};

constexpr int64_t kQK = 256;  // super-block size of the K-quants and IQ types

// Geometry from ggml-common.h: bytes per block of each type.
constexpr std::array<TypeEntry, 32> kTypes = {{
    {GgmlType::kF32, "F32", {1, 4}},
    {GgmlType::kF16, "F16", {1, 2}},
    {GgmlType::kQ4_0, "Q4_0", {32, 2 + 16}},
    {GgmlType::kQ4_1, "Q4_1", {32, 2 + 2 + 16}},
    {GgmlType::kQ5_0, "Q5_0", {32, 2 + 4 + 16}},
    {GgmlType::kQ5_1, "Q5_1", {32, 2 + 2 + 4 + 16}},
    {GgmlType::kQ8_0, "Q8_0", {32, 2 + 32}},
    {GgmlType::kQ8_1, "Q8_1", {32, 4 + 4 + 32}},
    {GgmlType::kQ2_K, "Q2_K", {kQK, 2 + 2 + kQK / 16 + kQK / 4}},
    {GgmlType::kQ3_K, "Q3_K", {kQK, 2 + kQK / 4 + kQK / 8 + 12}},
    {GgmlType::kQ4_K, "Q4_K", {kQK, 2 + 2 + kQK / 2 + 12}},
    {GgmlType::kQ5_K, "Q5_K", {kQK, 2 + 2 + kQK / 2 + kQK / 8 + 12}},
    {GgmlType::kQ6_K, "Q6_K", {kQK, 2 + kQK / 2 + kQK / 4 + kQK / 16}},
    {GgmlType::kQ8_K, "Q8_K", {kQK, 4 + kQK + kQK / 8}},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", {kQK, 2 + kQK / 4}},
    {GgmlType::kIQ2_XS, "IQ2_XS", {kQK, 2 + kQK / 4 + kQK / 32}},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", {kQK, 2 + kQK / 4 + kQK / 8}},
    {GgmlType::kIQ1_S, "IQ1_S", {kQK, 2 + kQK / 8 + kQK / 16}},
    {GgmlType::kIQ4_NL, "IQ4_NL", {32, 2 + 16}},
    {GgmlType::kIQ3_S, "IQ3_S", {kQK, 2 + kQK / 4 + kQK / 8 + kQK / 32 + 4}},
    {GgmlType::kIQ2_S, "IQ2_S", {kQK, 2 + kQK / 4 + kQK / 16}},
    {GgmlType::kIQ4_XS, "IQ4_XS", {kQK, 2 + 2 + kQK / 2 + kQK / 64}},
    {GgmlType::kI8, "I8", {1, 1}},
    {GgmlType::kI16, "I16", {1, 2}},
    {GgmlType::kI32, "I32", {1, 4}},
    {GgmlType::kI64, "I64", {1, 8}},
    {GgmlType::kF64, "F64", {1, 8}},
    {GgmlType::kIQ1_M, "IQ1_M", {kQK, kQK / 8 + kQK / 16 + kQK / 32}},
    {GgmlType::kBF16, "BF16", {1, 2}},
    {GgmlType::kTQ1_0, "TQ1_0", {kQK, 2 + 4 * 13}},
    {GgmlType::kTQ2_0, "TQ2_0", {kQK, 2 + 64}},
    {GgmlType::kMXFP4, "MXFP4", {32, 1 + 16}},
}};

const TypeEntry* find_entry(uint32_t type_id) {
  for (const TypeEntry& e : kTypes) {
    if (static_cast<uint32_t>(e.type) == type_id) return &e;
  }
  return nullptr;
}

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id) {
  const TypeEntry* e = find_entry(type_id);
  if (e == nullptr) return std::nullopt;
  return e->traits;
}

std::string ggml_type_name(GgmlType type) {
  const TypeEntry* e = find_entry(static_cast<uint32_t>(type));
  if (e == nullptr) return "type " + std::to_string(static_cast<uint32_t>(type));
  return e->name;
}

}  // namespace se
