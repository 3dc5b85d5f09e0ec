// Block-scaled FP8 expert weights for the grouped GEMM tests (CPU and CUDA): random e4m3 codes and block scales in
// the layout backend/moe_ops.h takes, with the fp32 weights they stand for. Test-only.
#pragma once

#include <cstdint>
#include <random>

#include "tensor/fp8.h"
#include "tensor/tensor.h"

namespace se::test {

struct Fp8Experts {
  Tensor codes;        // U8 [experts, n, k]
  Tensor scales;       // F32 [experts, n / block, k / block]
  Tensor dequantized;  // F32 [experts, n, k]
};

// Random e4m3 codes (no NaN patterns) with random positive block scales, and the weights they stand for.
inline Fp8Experts random_fp8_experts(int64_t experts, int64_t n, int64_t k, int64_t block, uint64_t seed) {
  Fp8Experts w{Tensor::empty(DType::kU8, {experts, n, k}), Tensor::empty(DType::kF32, {experts, n / block, k / block}),
               Tensor::empty(DType::kF32, {experts, n, k})};
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < w.scales.numel(); ++i)
    w.scales.data<float>()[i] = std::uniform_real_distribution<float>(0.001f, 0.01f)(rng);
  uint8_t* codes = w.codes.data<uint8_t>();
  for (int64_t i = 0; i < w.codes.numel(); ++i) {
    do codes[i] = static_cast<uint8_t>(rng());
    while ((codes[i] & 0x7f) == 0x7f);
  }
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const int64_t i = (e * n + r) * k + c;
        const float scale = w.scales.data<float>()[(e * (n / block) + r / block) * (k / block) + c / block];
        w.dequantized.data<float>()[i] = fp8_to_f32(codes[i], Fp8Format::kE4M3) * scale;
      }
  return w;
}

}  // namespace se::test
