#include "tensor/fp8.h"

#include <array>
#include <cmath>

namespace se {
namespace {

struct Fp8Layout {
  int mantissa_bits;
  int bias;
  uint8_t max_code;  // largest finite magnitude code
  uint8_t nan_code;  // canonical NaN (positive)
};

Fp8Layout layout_of(Fp8Format format) {
  if (format == Fp8Format::kE4M3) return {3, 7, 0x7e, 0x7f};
  return {2, 15, 0x7b, 0x7f};
}

// The code's value from its sign, exponent and mantissa bits.
float decode(uint8_t code, Fp8Format format) {
  const Fp8Layout l = layout_of(format);
  const int m = l.mantissa_bits;
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const uint32_t magnitude = code & 0x7fu;
  const uint32_t exponent = magnitude >> m;
  const uint32_t mantissa = magnitude & ((1u << m) - 1);
  const uint32_t max_exponent = 0x7fu >> m;
  if (format == Fp8Format::kE4M3 && magnitude == 0x7f) return std::nanf("");
  if (format == Fp8Format::kE5M2 && exponent == max_exponent) return mantissa == 0 ? sign * INFINITY : std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - l.bias - m);
  return sign * std::ldexp(static_cast<float>(mantissa | (1u << m)), static_cast<int>(exponent) - l.bias - m);
}

}  // namespace

float fp8_max_finite(Fp8Format format) { return fp8_to_f32(layout_of(format).max_code, format); }

uint8_t f32_to_fp8_satfinite(float f, Fp8Format format) {
  const Fp8Layout l = layout_of(format);
  if (std::isnan(f)) return l.nan_code;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a == 0.0f) return sign;
  if (std::isinf(a)) return static_cast<uint8_t>(sign | l.max_code);  // __NV_SATFINITE
  const int m = l.mantissa_bits;
  int exponent;  // a = frac * 2^exponent, frac in [0.5, 1)
  std::frexp(a, &exponent);
  int e = exponent - 1;            // a in [2^e, 2^(e+1))
  const int min_normal_e = 1 - l.bias;
  uint32_t code;
  if (e < min_normal_e) {
    // Subnormal: multiples of 2^(min_normal_e - m). A value rounding up to 2^m lands on the smallest normal,
    // whose code is the same integer.
    code = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, m - min_normal_e)));
  } else if (e - min_normal_e + 1 > 0x7f >> m) {
    code = l.max_code;  // far above the range: saturate
  } else {
    // a / 2^(e-m) lies in [2^m, 2^(m+1)) exactly; rounding to 2^(m+1) carries into the exponent field.
    const uint32_t q = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, m - e)));
    code = (static_cast<uint32_t>(e + l.bias) << m) + q - (1u << m);
  }
  if (code > l.max_code) code = l.max_code;  // __NV_SATFINITE
  return static_cast<uint8_t>(sign | code);
}

const float* fp8_code_values(Fp8Format format) {
  // Decoded once: callers convert whole rows and weight blocks code by code, and building each float from its bits
  // (ldexp) made an FP8 KV decode step on the CPU 10x an fp32 one.
  static const std::array<std::array<float, 256>, 2> kValues = [] {
    std::array<std::array<float, 256>, 2> values{};
    for (const Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (int c = 0; c < 256; ++c)
        values[static_cast<size_t>(f)][static_cast<size_t>(c)] = decode(static_cast<uint8_t>(c), f);
    return values;
  }();
  return kValues[static_cast<size_t>(format)].data();
}

float fp8_to_f32(uint8_t code, Fp8Format format) { return fp8_code_values(format)[code]; }

}  // namespace se
